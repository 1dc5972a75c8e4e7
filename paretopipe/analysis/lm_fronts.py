"""A language-model sweep's tables and fronts (no torch): the summary of its run records, the
physical bound of a decode step, and three fronts per network and prompt length:

- time to first token against time per output token (both minimised): prefill vs decode;
- tokens/s (maximised) against stage 1's memory (parameters and KV cache, minimised);
- time per token against the link's round trip, one line per cut.
"""

from __future__ import annotations

import csv
import json
import logging
from pathlib import Path
from typing import Any, Iterable, Sequence

import numpy as np

from .. import records
from ..errors import UsageError

log = logging.getLogger("paretopipe.report")

SESSION_FILE = "lm_session.json"
SUMMARY_FIELDS = ["model", "network", "prompt_len", "gen_tokens", "streams", "cut_dtype", "split", "status", "runs",
                  "ttft_median_s", "tpot_median_s", "tpot_p90_s", "tpot_p99_s", "tokens_per_s",
                  "stage1_decode_compute_s", "stage2_decode_compute_s", "stage1_memory_bytes", "stage1_kv_bytes",
                  "last_kv_bytes", "bytes_per_token", "prefill_bytes", "rtt_s", "rate_bytes_per_s", "bound_s",
                  "tpot_over_bound", "token_agreement", "max_logit_diff", "energy_per_token_modelled_j", "front_ttft_tpot", "front_tokens_memory", "note"]


def decode_bound_s(stage_decode_s: Sequence[float], bytes_per_token: float, rtt_s: float,
                   rate_bytes_per_s: float | None, result_bytes: int = 0) -> float:
    """The least a decode step can take at a cut: every stage's compute, one round trip, and the
    bytes that cross (the hidden state up, the token back) at the link's rate."""
    wire_s = (bytes_per_token + result_bytes) / rate_bytes_per_s if rate_bytes_per_s else 0.0
    return float(sum(stage_decode_s)) + rtt_s + wire_s


def _median(xs: Iterable[float | None]) -> float | None:
    vals = [x for x in xs if x is not None]
    return float(np.median(vals)) if vals else None


def link_figures(record: dict[str, Any]) -> tuple[float, float | None]:
    """The emulated link's round trip (both directions' delays) and its up rate in bytes/s."""
    link = (record.get("manifest") or {}).get("link") or {}
    cond = link.get("conditions") or {}
    up, down = cond.get("up") or {}, cond.get("down") or {}
    rtt = float(up.get("delay_ms") or 0) / 1e3 + float(down.get("delay_ms") or 0) / 1e3
    rate = up.get("rate_mbit_per_s")
    return rtt, (float(rate) * 1e6 / 8 if rate else None)


def summarize_config(recs: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """One summary row from the run records of one configuration (medians over runs)."""
    first = recs[0]
    cfg = first["config"]
    summaries = [r["summary"] for r in recs]
    stages = first["stages"]
    last = len(stages)
    rtt, rate = link_figures(first)
    hop = (first.get("hops") or [{}])[0]
    bpt = hop.get("bytes_per_token") or 0.0
    s1_dec = _median(s.get("stage1_decode_compute_median_s") for s in summaries)
    per_stage = [_median(s.get(f"stage{j}_decode_compute_median_s") for s in summaries) or 0.0
                 for j in range(1, last + 1)]
    bound = decode_bound_s(per_stage, bpt, rtt, rate, result_bytes=0)
    tpot = _median(s.get("tpot_median_s") for s in summaries)
    return {"model": cfg["model"], "network": cfg.get("network") or "unshaped",
            "prompt_len": max(cfg["prompt_tokens"]), "gen_tokens": cfg["gen_tokens"], "streams": cfg["streams"],
            "cut_dtype": cfg["cut_dtype"], "split": ",".join(map(str, cfg["splits"])), "status": "complete",
            "runs": len(recs), "ttft_median_s": _median(s.get("ttft_median_s") for s in summaries),
            "tpot_median_s": tpot, "tpot_p90_s": _median(s.get("tpot_p90_s") for s in summaries),
            "tpot_p99_s": _median(s.get("tpot_p99_s") for s in summaries),
            "tokens_per_s": _median(s.get("tokens_per_s") for s in summaries),
            "stage1_decode_compute_s": s1_dec, "stage2_decode_compute_s": per_stage[-1] if last > 1 else None,
            "stage1_memory_bytes": stages[0]["param_bytes"] + stages[0]["kv_bytes"],
            "stage1_kv_bytes": stages[0]["kv_bytes"], "last_kv_bytes": stages[-1]["kv_bytes"],
            "bytes_per_token": bpt, "prefill_bytes": hop.get("prefill_bytes"), "rtt_s": rtt,
            "rate_bytes_per_s": rate, "bound_s": bound,
            "tpot_over_bound": tpot / bound if tpot and bound > 0 else None,
            "token_agreement": _median(s.get("token_agreement") for s in summaries),
            "energy_per_token_modelled_j": _median(s.get("energy_per_token_modelled_j") for s in summaries),
            "max_logit_diff": max((s["max_logit_diff"] for s in summaries if s.get("max_logit_diff") is not None),
                                  default=None), "note": ""}


def pareto_mask(points: np.ndarray) -> np.ndarray:
    """Rows no other row beats in every column and strictly in one (all minimised)."""
    keep = np.ones(len(points), dtype=bool)
    for i, p in enumerate(points):
        dominated = np.all(points <= p, axis=1) & np.any(points < p, axis=1)
        keep[i] = not dominated.any()
    return keep


def mark_fronts(rows: list[dict[str, Any]]) -> None:
    """Per (network, prompt length): ``front_ttft_tpot`` and ``front_tokens_memory`` of each
    complete row (infeasible rows are on no front)."""
    groups: dict[tuple, list[dict[str, Any]]] = {}
    for r in rows:
        r["front_ttft_tpot"] = r["front_tokens_memory"] = False
        if r["status"] == "complete" and r["ttft_median_s"] is not None and r["tpot_median_s"] is not None:
            groups.setdefault((r["network"], r["prompt_len"], r["cut_dtype"]), []).append(r)
    for group in groups.values():
        a = np.array([[r["ttft_median_s"], r["tpot_median_s"]] for r in group])
        b = np.array([[-(r["tokens_per_s"] or 0.0), r["stage1_memory_bytes"]] for r in group])
        for r, on_a, on_b in zip(group, pareto_mask(a), pareto_mask(b)):
            r["front_ttft_tpot"], r["front_tokens_memory"] = bool(on_a), bool(on_b)


def write_summary(session: Path, rows: list[dict[str, Any]]) -> Path:
    mark_fronts(rows)
    rows.sort(key=lambda r: (r["network"], r["prompt_len"], r["cut_dtype"], [int(k) for k in r["split"].split(",")]))
    lines = [",".join(SUMMARY_FIELDS)]
    for r in rows:
        lines.append(",".join(_cell(r.get(k)) for k in SUMMARY_FIELDS))
    return records.atomic_write_text(session / "summary.csv", "\n".join(lines) + "\n")


def _cell(v: Any) -> str:
    if v is None:
        return ""
    if isinstance(v, float):
        return f"{v:.6g}"
    text = str(v)
    return f'"{text}"' if "," in text else text


def read_summary(session: Path) -> list[dict[str, Any]]:
    path = Path(session) / "summary.csv"
    if not path.is_file():
        raise UsageError(f"{session}: no summary.csv (a language-model sweep writes it as it goes)")
    with open(path, newline="") as fh:
        return list(csv.DictReader(fh))


def front_table(rows: list[dict[str, Any]]) -> str:
    """Per network and prompt length: each split's time to first token and time per token, the
    fronts marked (* TTFT/TPOT, + tokens/s vs stage-1 memory), and measured over bound."""
    out = []
    key = lambda r: (r["network"], int(r["prompt_len"]), r["cut_dtype"])  # noqa: E731
    for group in sorted({key(r) for r in rows}):
        out.append(f"{rows[0]['model']} on {group[0]}, prompt {group[1]} tokens, cut {group[2]}:")
        out.append(f"  {'split':>6} {'TTFT ms':>9} {'TPOT ms':>9} {'tok/s':>7} {'s1 MB':>7} {'B/token':>8} "
                   f"{'bound ms':>9} {'/bound':>7}  front")
        for r in (r for r in rows if key(r) == group):
            if r["status"] != "complete":
                out.append(f"  {r['split']:>6} {r['status']}: {r['note']}")
                continue
            marks = ("*" if _true(r["front_ttft_tpot"]) else " ") + ("+" if _true(r["front_tokens_memory"]) else " ")
            out.append(f"  {r['split']:>6} {_ms(r['ttft_median_s']):>9} {_ms(r['tpot_median_s']):>9} "
                       f"{_f(r['tokens_per_s'], '.1f'):>7} {_f(_num(r['stage1_memory_bytes']) / 1e6, '.1f'):>7} "
                       f"{_f(r['bytes_per_token'], '.0f'):>8} {_ms(r['bound_s']):>9} {_f(r['tpot_over_bound'], '.2f'):>7}"
                       f"  {marks}")
    out.append("front: * time to first token vs time per token, + tokens/s vs stage-1 memory; "
               "/bound: measured time per token over (stages' decode compute + round trip + bytes/rate)")
    return "\n".join(out)


def _true(v: Any) -> bool:
    return v is True or str(v) == "True"


def _num(v: Any) -> float:
    return float(v) if v not in (None, "") else float("nan")


def _ms(v: Any) -> str:
    return "" if v in (None, "") else f"{float(v) * 1e3:.2f}"


def _f(v: Any, fmt: str) -> str:
    return "" if v in (None, "") or v != v else format(float(v), fmt)


def draw_fronts(session: Path, rows: list[dict[str, Any]]) -> list[Path]:
    """The three figures, one panel per network, into ``SESSION/report/``."""
    import matplotlib  # lazy for start-up: matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # lazy for start-up: matplotlib

    done = [r for r in rows if r["status"] == "complete"]
    if not done:
        log.info("no complete configuration: no figure to draw")
        return []
    report = Path(session) / "report"
    report.mkdir(parents=True, exist_ok=True)
    networks = sorted({r["network"] for r in done})
    written = []
    specs = [("lm_ttft_vs_tpot.png", "ttft_median_s", "tpot_median_s", "time to first token (ms)",
              "time per token (ms)", "front_ttft_tpot"),
             ("lm_tokens_vs_memory.png", "stage1_memory_bytes", "tokens_per_s", "stage-1 memory (MB)",
              "tokens/s", "front_tokens_memory")]
    for name, xk, yk, xl, yl, front in specs:
        fig, axes = plt.subplots(1, len(networks), figsize=(4.5 * len(networks), 3.6), squeeze=False)
        for ax, net in zip(axes[0], networks):
            for plen in sorted({int(r["prompt_len"]) for r in done if r["network"] == net}):
                pts = [r for r in done if r["network"] == net and int(r["prompt_len"]) == plen]
                xs = [_num(r[xk]) * (1e3 if xk.endswith("_s") else 1e-6) for r in pts]
                ys = [_num(r[yk]) * (1e3 if yk.endswith("_s") else 1) for r in pts]
                ax.scatter(xs, ys, s=12, alpha=0.5, label=f"prompt {plen}")
                on = sorted((x, y, r["split"]) for x, y, r in zip(xs, ys, pts) if _true(r[front]))
                ax.plot([p[0] for p in on], [p[1] for p in on], "-o", ms=4)
                for x, y, k in on:
                    ax.annotate(k, (x, y), fontsize=7)
            ax.set_title(net)
            ax.set_xlabel(xl)
            ax.set_ylabel(yl)
            ax.legend(fontsize=7)
        fig.tight_layout()
        path = report / name
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(path)
    fig, ax = plt.subplots(figsize=(5.5, 3.8))
    for split in sorted({r["split"] for r in done}, key=lambda k: [int(x) for x in k.split(",")]):
        pts = sorted((_num(r["rtt_s"]) * 1e3, _num(r["tpot_median_s"]) * 1e3) for r in done if r["split"] == split)
        ax.plot([p[0] for p in pts], [p[1] for p in pts], "-o", ms=3, lw=0.8, label=split)
    ax.set_xlabel("link round trip (ms)")
    ax.set_ylabel("time per token (ms)")
    ax.legend(fontsize=6, ncol=3, title="split")
    fig.tight_layout()
    path = report / "lm_tpot_vs_rtt.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    written.append(path)
    return written


def find_lm_session(path: Path) -> Path | None:
    """A language-model session folder itself, or the newest session inside a folder of sessions
    when that one is a language model's."""
    path = Path(path)
    if (path / SESSION_FILE).is_file():
        return path
    if not path.is_dir():
        return None
    # The newest session of either kind decides: a folder holding image sessions too reports those
    # when one of them is newer (session folders are named by their start time).
    newest = max((p.parent for name in (SESSION_FILE, "session.json") for p in path.glob(f"*/{name}")),
                 key=lambda p: p.name, default=None)
    return newest if newest is not None and (newest / SESSION_FILE).is_file() else None


def report(session: Path) -> str:
    """``paretopipe report`` of a language-model session: the table, and the figures written."""
    rows = read_summary(session)
    figures = draw_fronts(session, rows)
    meta = json.loads((Path(session) / SESSION_FILE).read_text())
    return front_table(rows) + "\n" + f"session {session} ({meta.get('runs_done', '?')} runs); figures: " + \
        ", ".join(str(p) for p in figures)
