"""What a split language-model run is on any backend: its configuration, the stages a process
holds across runs, each stage's part of the record and each hop's bytes (``tcp.lm`` and
``rpc_lm`` drive the runs)."""

from __future__ import annotations

import dataclasses
import resource
import sys
from typing import Any

from ..llm.build import LMSource, build_stage
from ..llm.generate import Sampling
from ..llm.shapes import LMShape, cut_bytes_per_token, stage_blocks, stage_layers
from ..llm.stage import LMStage
from ..manifest import node_manifest
from ..network import deadlines
from ..network.conditions import NetworkConditions

LM_RECORD_KIND = "llm"


@dataclasses.dataclass
class LMRunConfig:
    model: str
    identity: str
    splits: list[int]
    gen_tokens: int
    streams: int
    prompt_tokens: list[int]  # each stream's prompt length
    cut_dtype: str = "float32"
    temperature: float = 0.0
    top_k: int = 0
    seed: int = 0
    warmup: int = 1
    timeout_s: float = 60.0
    network: str | None = None
    # The last stage compares its logits with the unsplit float32 model's after the run (teacher-forced on
    # the generated tokens): on by default for a lossy cut dtype, so the bytes it saves come with their cost.
    check_exact: bool = False
    # Declared powers per stage, for the modelled energy per token (no sensor here: labelled modelled).
    power_idle_w: list[float | None] | None = None
    power_core_w: list[float | None] | None = None

    @property
    def sampling(self) -> Sampling:
        return Sampling(self.temperature, self.top_k, self.seed)


def peak_rss_bytes() -> int:
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(rss if sys.platform == "darwin" else rss * 1024)


class LMStages:
    """A process's built stages, one per plan position, kept across runs of one connection."""

    def __init__(self, src: LMSource) -> None:
        self.src = src
        self._built: dict[tuple[tuple[int, ...], int], LMStage] = {}

    def get(self, splits: list[int], index: int) -> LMStage:
        key = (tuple(splits), index)
        if key not in self._built:
            self._built.clear()  # one plan at a time: a process holds its own stage only
            self._built[key] = LMStage(build_stage(self.src, splits, index))
        stage = self._built[key]
        stage.reset()
        return stage


def stage_part(stage: LMStage, index: int, cfg: LMRunConfig, src: LMSource, sent_bytes: int,
                threads: int | None) -> dict[str, Any]:
    measured = [s for s in stage.caches if s < cfg.streams]
    first, end = stage_blocks(src.shape, cfg.splits, index)
    layers = stage_layers(src.shape, cfg.splits, index)
    return {"stage": index + 1, "blocks": [first, end], "layers": [layers.start, layers.stop],
            "compute_prefill_s": stage.compute_s("prefill", cfg.streams),
            "compute_decode_s": stage.compute_s("decode", cfg.streams),
            "kv_bytes": sum(stage.caches[s].nbytes() for s in measured),
            "kv_tokens": sum(stage.caches[s].length() for s in measured) if layers else 0,
            "param_bytes": stage.parts.param_bytes(), "peak_rss_bytes": peak_rss_bytes(),
            "bytes_sent": sent_bytes, "weights_fingerprint": stage.parts.fingerprint(),
            "manifest": node_manifest("cpu", threads, role=f"stage{index + 1}")}


def hop_figures(stages: list[dict[str, Any]], stage1_bytes: dict[str, int], cfg: LMRunConfig) -> list[dict[str, Any]]:
    """Each hop's bytes: the prefill's, and per decode token (what stage j put on the wire for
    its hidden states; stage 1's own count, the later stages' from their parts)."""
    out = []
    for j, st in enumerate(stages[:-1], start=1):
        counts = stage1_bytes if j == 1 else st.get("hop_bytes") or {}
        steps = counts.get("decode_steps") or 0
        out.append({"hop": f"{j}-{j + 1}", "prefill_bytes": counts.get("prefill", 0),
                    "bytes_per_token": counts.get("decode", 0) / steps if steps else None})
    return out




def new_hop_bytes() -> dict[str, int]:
    """What a stage put on its next hop: the prefills' bytes, the decode steps' bytes and their count."""
    return {"prefill": 0, "decode": 0, "decode_steps": 0}


def count_hop(hop_bytes: dict[str, int], start: int, nbytes: int) -> None:
    """One step sent on: a prefill starts at position 0, a decode step anywhere after."""
    hop_bytes["prefill" if start == 0 else "decode"] += nbytes
    hop_bytes["decode_steps"] += start != 0


def run_timeout_s(shape: LMShape, conditions: NetworkConditions | None, prompt_len: int, first_split: int,
                  cut_dtype: str, streams: int) -> float:
    """The run's deadline from its largest step (every stream's prefill in flight at once), as the
    image runs derive theirs from a batch (network.deadlines)."""
    nbytes = prompt_len * cut_bytes_per_token(shape, first_split, cut_dtype)
    return deadlines.run_timeout_s(conditions, nbytes, 64, in_flight=streams)
