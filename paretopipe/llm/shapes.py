"""The shapes of real small decoder-only LMs, and the cuts between their blocks. No torch here:
``split --list`` and the argument checks read these without building anything.

The blocks of a model of L decoder layers are, in order: the token embedding, the L layers, the
final norm and the LM head. Split k puts the first k blocks on stage 1; k = 0 sends token ids,
1 .. L+1 send the hidden state after the embedding or after layer k-1, L+2 sends the normed
hidden state. The last stage always holds the LM head, because it chooses the next token."""

from __future__ import annotations

import dataclasses
from typing import Any

from ..errors import UsageError
from ..workload import GENERATION, IMAGES, Workload
from ..wiredtype import token_nbytes
from .checkpoints import REAL, display_name, folder_config, is_real
TOKEN_ID_BYTES = 8    # split 0: the token ids cross, as int64
CUT_PREFIX = "lm"


def cut_name(split: int) -> str:
    return f"{CUT_PREFIX}{split}"


def split_of(cut: str) -> int:
    """The split a cut's name holds (``lm3`` -> 3)."""
    if not (isinstance(cut, str) and cut.startswith(CUT_PREFIX) and cut[len(CUT_PREFIX):].isdigit()):
        raise UsageError(f"cut {str(cut)[:40]!r} is not a language model's (lm0, lm1, ...)")
    return int(cut[len(CUT_PREFIX):])


@dataclasses.dataclass(frozen=True)
class LMShape:
    """The numbers that fix a model's tensors (a transformers configuration's, by their names)."""

    name: str
    architecture: str  # transformers' model_type: llama or qwen2
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    vocab_size: int
    max_position_embeddings: int
    tie_word_embeddings: bool
    rope_theta: float
    rms_norm_eps: float
    head_dim: int | None = None
    rope_scaling: dict[str, Any] | None = None
    source: str = ""  # where the numbers come from

    @property
    def kv_head_dim(self) -> int:
        return self.head_dim or self.hidden_size // self.num_attention_heads

    @property
    def num_blocks(self) -> int:
        """Embedding, layers, final norm, LM head."""
        return self.num_hidden_layers + 3

    @property
    def last_split(self) -> int:
        """The largest split: everything but the LM head on stage 1."""
        return self.num_hidden_layers + 2

    def kv_bytes_per_token(self, layers: int, element_bytes: int = 4) -> int:
        """Keys and values of ``layers`` layers for one token."""
        return 2 * self.num_key_value_heads * self.kv_head_dim * element_bytes * layers

    def config_dict(self) -> dict[str, Any]:
        """The transformers configuration's fields."""
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name not in ("name", "source")}
        out["model_type"] = out.pop("architecture")
        if out["head_dim"] is None:
            out.pop("head_dim")
        if out["rope_scaling"] is None:
            out.pop("rope_scaling")
        return out


def _llama(name: str, source: str, **kw: Any) -> LMShape:
    defaults = dict(architecture="llama", rms_norm_eps=1e-5)
    return LMShape(name=name, source=source, **{**defaults, **kw})


# The published config.json of each model (Hugging Face hub), copied by hand: nothing is fetched.
NAMED: dict[str, LMShape] = {s.name: s for s in (
    _llama("smollm2-135m", "HuggingFaceTB/SmolLM2-135M", hidden_size=576, intermediate_size=1536,
           num_hidden_layers=30, num_attention_heads=9, num_key_value_heads=3, vocab_size=49152,
           max_position_embeddings=8192, tie_word_embeddings=True, rope_theta=100000.0),
    _llama("smollm2-360m", "HuggingFaceTB/SmolLM2-360M", hidden_size=960, intermediate_size=2560,
           num_hidden_layers=32, num_attention_heads=15, num_key_value_heads=5, vocab_size=49152,
           max_position_embeddings=8192, tie_word_embeddings=True, rope_theta=100000.0),
    LMShape(name="qwen2.5-0.5b", source="Qwen/Qwen2.5-0.5B", architecture="qwen2", hidden_size=896,
            intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2,
            vocab_size=151936, max_position_embeddings=32768, tie_word_embeddings=True, rope_theta=1000000.0,
            rms_norm_eps=1e-6),
    _llama("llama-3.2-1b", "meta-llama/Llama-3.2-1B", hidden_size=2048, intermediate_size=8192,
           num_hidden_layers=16, num_attention_heads=32, num_key_value_heads=8, vocab_size=128256,
           max_position_embeddings=131072, tie_word_embeddings=True, rope_theta=500000.0, head_dim=64,
           rope_scaling={"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                         "original_max_position_embeddings": 8192}),
    _llama("tinyllama-1.1b", "TinyLlama/TinyLlama-1.1B-intermediate-step-1431k-3T", hidden_size=2048,
           intermediate_size=5632, num_hidden_layers=22, num_attention_heads=32, num_key_value_heads=4,
           vocab_size=32000, max_position_embeddings=2048, tie_word_embeddings=False, rope_theta=10000.0),
    # For tests and the demo: every kind of block, grouped-query attention, a byte-level vocabulary.
    _llama("tiny-lm", "ParetoPipe's own, for tests and the demo", hidden_size=64, intermediate_size=128,
           num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, vocab_size=260,
           max_position_embeddings=512, tie_word_embeddings=True, rope_theta=10000.0),
)}
ALIASES = {"smollm2": "smollm2-135m", "qwen2.5": "qwen2.5-0.5b", "llama-3.2": "llama-3.2-1b", "tinyllama": "tinyllama-1.1b"}


def normalize(name: str) -> str:
    return name.strip().lower().replace("_", "-")


def is_named(name: str | None) -> bool:
    return name is not None and (normalize(name) in NAMED or normalize(name) in ALIASES)


def named(name: str) -> LMShape:
    key = ALIASES.get(normalize(name), normalize(name))
    if key not in NAMED:
        raise UsageError(f"unknown language model {name!r}; named ones: {', '.join(NAMED)} (portable weights), "
                         f"{', '.join(REAL)} (trained), or --model-dir DIR|FILE.gguf|HUB_ID")
    return NAMED[key]


def shape_from_config(config: dict[str, Any], name: str) -> LMShape:
    """A shape from a config.json's fields (a user's model folder)."""
    arch = config.get("model_type")
    fields = {f.name for f in dataclasses.fields(LMShape)}
    try:
        values = {k: config[k] for k in fields - {"name", "architecture", "source", "head_dim", "rope_scaling",
                                                  "rms_norm_eps", "rope_theta", "tie_word_embeddings",
                                                  "num_key_value_heads"}}
    except KeyError as exc:
        raise UsageError(f"{name}: config.json has no {exc.args[0]!r}; a decoder-only causal LM's config names "
                         f"its hidden size, layers, heads, vocabulary and positions")
    rope = config.get("rope_parameters") or {}
    return LMShape(name=name, architecture=str(arch), source=name,
                   num_key_value_heads=int(config.get("num_key_value_heads") or config["num_attention_heads"]),
                   rms_norm_eps=float(config.get("rms_norm_eps", 1e-6)),
                   rope_theta=float(config.get("rope_theta", rope.get("rope_theta", 10000.0))),
                   tie_word_embeddings=bool(config.get("tie_word_embeddings", False)),
                   head_dim=config.get("head_dim"), rope_scaling=config.get("rope_scaling"), **values)


@dataclasses.dataclass(frozen=True)
class LMCut:
    """Split ``k``: what crosses from stage 1 and how many bytes it takes per token."""

    split: int
    after: str
    crosses: str
    bytes_per_token: int


def block_names(shape: LMShape) -> list[str]:
    return ["embed", *(f"layer{i}" for i in range(shape.num_hidden_layers)), "norm", "lm_head"]


def cut_bytes_per_token(shape: LMShape, split: int, cut_dtype: str = "float32") -> int:
    check_split(shape, split)
    if split == 0:
        return TOKEN_ID_BYTES
    return token_nbytes(shape.hidden_size, cut_dtype)


def cuts(shape: LMShape, cut_dtype: str = "float32") -> list[LMCut]:
    names = block_names(shape)
    out = []
    for k in range(shape.last_split + 1):
        crosses = ("token ids" if k == 0 else "normed hidden state" if k == shape.last_split
                   else "hidden state")
        out.append(LMCut(k, "input" if k == 0 else names[k - 1], crosses, cut_bytes_per_token(shape, k, cut_dtype)))
    return out


def check_split(shape: LMShape, split: int) -> int:
    if not 0 <= split <= shape.last_split:
        raise UsageError(f"split {split} is out of range for {shape.name}: 0..{shape.last_split} (0 sends token ids, "
                         f"{shape.last_split} the normed hidden state; the last stage holds the LM head)")
    return split


def check_plan(shape: LMShape, splits: list[int]) -> list[int]:
    """A chain's splits: each in range, strictly increasing."""
    for k in splits:
        check_split(shape, k)
    if any(b <= a for a, b in zip(splits, splits[1:])):
        raise UsageError(f"splits {','.join(map(str, splits))}: a chain's splits must increase (stage j runs the "
                         f"blocks between two of them)")
    return splits


def stage_blocks(shape: LMShape, splits: list[int], index: int) -> tuple[int, int]:
    """The blocks [first, end) stage ``index`` (0-based) holds in a plan."""
    bounds = [0, *splits, shape.num_blocks]
    return bounds[index], bounds[index + 1]


def stage_layers(shape: LMShape, splits: list[int], index: int) -> range:
    """The decoder layers a stage holds (block i + 1 is layer i)."""
    first, end = stage_blocks(shape, splits, index)
    lo, hi = max(first, 1), min(end, shape.num_hidden_layers + 1)
    return range(lo - 1, max(hi, lo) - 1)


def block_params(shape: LMShape) -> list[int]:
    """Parameters of each block. A tied LM head counts on the stage that holds it, which must hold
    the embedding's matrix too (once, where the same stage holds both)."""
    h, hd = shape.hidden_size, shape.kv_head_dim
    q, kv = shape.num_attention_heads * hd, shape.num_key_value_heads * hd
    bias = q + 2 * kv if shape.architecture == "qwen2" else 0
    layer = h * q + 2 * h * kv + q * h + bias + 3 * h * shape.intermediate_size + 2 * h
    embed = shape.vocab_size * h
    return [embed, *([layer] * shape.num_hidden_layers), h, embed]


def cut_table(shape: LMShape, cut_dtype: str = "float32") -> str:
    """``split --list`` for a language model: each split, what crosses and its bytes per token,
    and what stage 1 then holds (parameters, KV cache per token of context)."""
    params = block_params(shape)
    rows = [f"{shape.name} ({shape.architecture}, {shape.num_hidden_layers} layers, hidden {shape.hidden_size}, "
            f"{shape.num_attention_heads} heads / {shape.num_key_value_heads} KV heads, vocabulary {shape.vocab_size}"
            f"{', tied embeddings' if shape.tie_word_embeddings else ''}); cut dtype {cut_dtype}",
            f"{'split':>5}  {'after':<9} {'crosses':<20} {'B/token':>8}  {'stage-1 MB':>10}  {'stage-1 KV B/token':>18}"]
    for cut in cuts(shape, cut_dtype):
        layers = len(stage_layers(shape, [cut.split], 0))
        rows.append(f"{cut.split:>5}  {cut.after:<9} {cut.crosses:<20} {cut.bytes_per_token:>8}  "
                    f"{sum(params[:cut.split]) * 4 / 1e6:>10.1f}  {shape.kv_bytes_per_token(layers):>18}")
    rows.append(f"(the last stage holds the LM head: {params[-1] * 4 / 1e6:.1f} MB; a prefill of T tokens sends T x "
                f"B/token, each decode step B/token)")
    return "\n".join(rows)


def workload_of(model: str | None, model_dir: str | None = None) -> Workload:
    """A stage's model's workload: a generation for a language model (weights given by
    ``--model-dir``, a named real one, or a named shape), else image batches. The one test of a
    model's kind."""
    return GENERATION if model_dir is not None or is_named(model) or is_real(model) else IMAGES


def shape_of(model: str | None, model_dir: str | None = None) -> LMShape:
    """A language model's shape without building it: a named one, or its folder's config.json
    (a GGUF's or a named real model's folder is made first: :mod:`paretopipe.llm.checkpoints`)."""
    if model_dir is None and not is_real(model):
        return named(model or "")
    _, config, _ = folder_config(model, model_dir)
    return shape_from_config(config, display_name(model, model_dir))
