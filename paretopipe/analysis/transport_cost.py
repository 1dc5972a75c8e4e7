"""What each protocol costs at every split: each configuration over another transport
(``--transport websocket|mqtt``) beside its raw-TCP twin, the configuration that differs from it
only in its transport, from one session's front table.

The ratios are of the two configurations' medians over runs, measured in one session with the
groups' runs interleaved by round. Whether a transport moves a split on or off the front is in
``on_front`` and ``on_front_tcp`` (each transport's own panel)."""

from __future__ import annotations

import pandas as pd

from .keys import KEY_DEFAULTS, PLAIN, RAW_TCP
from .objectives import throughput_column

#: A configuration's raw-TCP twin shares all of these.
TWIN = ["model", "backend", "cipher", "network", "batch_size", "split_index", "prompt_len", "placement"]
COLUMNS = TWIN + ["transport", "latency_tcp_s", "latency_s", "latency_ratio", "throughput_tcp_imgs_per_s",
                  "throughput_imgs_per_s", "throughput_ratio", "on_front_tcp", "on_front"]


def transport_cost(configs: pd.DataFrame) -> pd.DataFrame:
    """One row per configuration over another transport that has a raw-TCP twin (``COLUMNS``)."""
    if configs.empty or "transport" not in configs.columns or not configs["transport"].ne(RAW_TCP).any():
        return pd.DataFrame(columns=COLUMNS)
    done = configs[configs.get("status", pd.Series("complete", index=configs.index)).fillna("complete")
                   .eq("complete")]
    keyed = done.assign(split_index=done["split_index"].astype(str),
                        cipher=done["cipher"] if "cipher" in done.columns else PLAIN,
                        on_front=done["on_front"] if "on_front" in done.columns else False,
                        prompt_len=done["prompt_len"] if "prompt_len" in done.columns else KEY_DEFAULTS["prompt_len"],
                        placement=done["placement"] if "placement" in done.columns else KEY_DEFAULTS["placement"])
    thr = throughput_column(keyed)  # images/s, or a language model's tokens/s
    tcp = keyed[keyed["transport"] == RAW_TCP][TWIN + ["latency_s", thr, "on_front"]]
    both = keyed[keyed["transport"] != RAW_TCP].merge(tcp, on=TWIN, suffixes=("", "_tcp"))
    if both.empty:
        return pd.DataFrame(columns=COLUMNS)
    out = both[TWIN + ["transport", "latency_s", thr, "on_front", "on_front_tcp"]].copy()
    out["latency_tcp_s"] = both["latency_s_tcp"]
    unit = thr.removeprefix("throughput_") if thr.startswith("throughput_") else thr
    out[f"throughput_tcp_{unit}"] = both[f"{thr}_tcp"]
    out["latency_ratio"] = both["latency_s"] / both["latency_s_tcp"]
    out["throughput_ratio"] = both[thr] / both[f"{thr}_tcp"]
    return out.sort_values(["model", "network", "transport", "split_index"]).reset_index(drop=True)


def format_transport_cost(table: pd.DataFrame) -> str:
    """The table the sweep and ``report`` print: each transport over raw TCP, per split."""
    if table.empty:
        return ""
    show = table.copy()
    show["latency_ratio"] = [f"x{v:.3f}" for v in show["latency_ratio"]]
    show["throughput_ratio"] = [f"x{v:.3f}" for v in show["throughput_ratio"]]
    show["front"] = [("on" if a else "off") + (" (tcp: on)" if b else " (tcp: off)")
                     for a, b in zip(show["on_front"], show["on_front_tcp"])]
    cols = ["model", "network", "transport", "split_index", "latency_tcp_s", "latency_s", "latency_ratio",
            "throughput_ratio", "front"]
    return ("What each transport costs per split (over raw TCP, medians over runs; front: on its own "
            "transport's front, and the TCP twin on TCP's):\n"
            + show[cols].to_string(index=False, float_format=lambda v: f"{v:.4g}"))
