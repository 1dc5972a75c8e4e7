"""What privacy costs at every split: each sealed configuration (``--encrypt``) beside its plain
twin, the configuration that differs from it only in its cipher, from one session's summary.

The ratios are of the two configurations' medians over runs, measured in one session with the
groups' runs interleaved by round; ``seal_open_mean_s`` is what sealing and opening took per
batch on the critical path (both frames, both stages), the part of the latency the cipher added
by itself.
"""

from __future__ import annotations

import re

import pandas as pd

from .keys import KEY_DEFAULTS, PLAIN, RAW_TCP
from .objectives import throughput_column

#: A sealed configuration's plain twin shares all of these.
TWIN = ["model", "backend", "transport", "network", "batch_size", "split_index", "prompt_len", "placement"]
_SEAL_OPEN = re.compile(r"^(stage\d+_(seal|open)|result_open)_mean_s$")
COLUMNS = TWIN + ["cipher", "latency_plain_s", "latency_sealed_s", "latency_ratio", "throughput_plain_imgs_per_s",
                  "throughput_sealed_imgs_per_s", "throughput_ratio", "seal_open_mean_s"]


def privacy_cost(configs: pd.DataFrame) -> pd.DataFrame:
    """One row per sealed configuration that has a plain twin (``COLUMNS``); empty otherwise."""
    done = configs[configs.get("status", pd.Series("complete", index=configs.index)).fillna("complete")
                   .eq("complete")] if len(configs) else configs
    if done.empty or "cipher" not in done.columns or not done["cipher"].ne(PLAIN).any():
        return pd.DataFrame(columns=COLUMNS)
    keyed = done.assign(split_index=done["split_index"].astype(str),
                        transport=done["transport"] if "transport" in done.columns else RAW_TCP,
                        prompt_len=done["prompt_len"] if "prompt_len" in done.columns else KEY_DEFAULTS["prompt_len"],
                        placement=done["placement"] if "placement" in done.columns else KEY_DEFAULTS["placement"])
    thr = throughput_column(keyed)  # images/s, or a language model's tokens/s
    plain = keyed[keyed["cipher"] == PLAIN]
    sealed = keyed[keyed["cipher"] != PLAIN]
    both = sealed.merge(plain[TWIN + ["latency_s", thr]], on=TWIN, suffixes=("", "_plain"))
    if both.empty:
        return pd.DataFrame(columns=COLUMNS)
    parts = [c for c in both.columns if _SEAL_OPEN.match(c)]
    out = both[TWIN + ["cipher"]].copy()
    out["latency_plain_s"] = both["latency_s_plain"]
    out["latency_sealed_s"] = both["latency_s"]
    out["latency_ratio"] = both["latency_s"] / both["latency_s_plain"]
    unit = thr.removeprefix("throughput_") if thr.startswith("throughput_") else thr
    out[f"throughput_plain_{unit}"] = both[f"{thr}_plain"]
    out[f"throughput_sealed_{unit}"] = both[thr]
    out["throughput_ratio"] = both[thr] / both[f"{thr}_plain"]
    out["seal_open_mean_s"] = both[parts].astype(float).fillna(0).sum(axis=1) if parts else float("nan")
    return out.reset_index(drop=True)


def format_privacy_cost(table: pd.DataFrame) -> str:
    """The table the sweep and ``report`` print: latency and throughput sealed over plain, per split."""
    if table.empty:
        return ""
    show = table.copy()
    show["latency_ratio"] = [f"x{v:.3f}" for v in show["latency_ratio"]]
    show["throughput_ratio"] = [f"x{v:.3f}" for v in show["throughput_ratio"]]
    show["seal_open_ms"] = show.pop("seal_open_mean_s") * 1e3
    cols = ["model", "network", "cipher", "split_index", "latency_plain_s", "latency_sealed_s", "latency_ratio",
            "throughput_ratio", "seal_open_ms"]
    return ("What encryption costs per split (sealed over plain, medians over runs; seal_open_ms: sealing and "
            "opening per batch):\n" + show[cols].to_string(index=False, float_format=lambda v: f"{v:.4g}"))
