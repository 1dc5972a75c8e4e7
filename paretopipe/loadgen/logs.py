"""LoadGen's logs read into the record's figures.

The figures come from ``mlperf_log_detail.txt``: each line ``:::MLLOG {json}`` holds one key
(``result_validity``, ``result_99.00_percentile_latency_ns``, ``early_stopping_latency_ss``, ...),
the same values ``mlperf_log_summary.txt`` prints for people. Latencies become seconds.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from ..errors import ParetoPipeError

SUMMARY = "mlperf_log_summary.txt"
DETAIL = "mlperf_log_detail.txt"
ACCURACY = "mlperf_log_accuracy.json"
#: The files a run folder keeps (the trace is off: it is large and LoadGen's own tooling reads it).
KEPT = (SUMMARY, DETAIL)
_PERCENTILE = re.compile(r"result_(\d+\.\d+)_percentile_(per_query_)?latency_ns")
#: A generation's token latencies (``use_token_latencies``): the first token's and each later one's.
_TOKEN_PERCENTILE = re.compile(r"result_(?:first_token_(\d+\.\d+)_percentile_latency_ns|"
                               r"time_per_output_token_(\d+\.\d+)_percentile_ns)")
_TOKEN_MEANS = {"result_first_token_mean_latency_ns": "loadgen_ttft_mean_s",
                "result_time_to_output_token_mean": "loadgen_tpot_mean_s"}
_TOKEN_RATES = ("result_tokens_per_second", "result_completed_tokens_per_second")
#: Early-stopping estimates by the key LoadGen logs them under: SingleStream's p90, MultiStream's p99.
_EARLY = {"early_stopping_latency_ss": "loadgen_early_stopping_p90_s",
          "early_stopping_latency_ms": "loadgen_early_stopping_p99_s"}


def read_detail(path: Path) -> dict[str, Any]:
    """Every key of a detail log (the last value where one repeats)."""
    out: dict[str, Any] = {}
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError as exc:
        raise ParetoPipeError(f"LoadGen wrote no detail log at {path}: {exc.strerror or exc}")
    for line in lines:
        if not line.startswith(":::MLLOG "):
            continue
        try:
            entry = json.loads(line[len(":::MLLOG "):])
        except json.JSONDecodeError:
            continue
        if isinstance(entry, dict) and isinstance(entry.get("key"), str):
            out[entry["key"]] = entry.get("value")
    return out


def _percentile_name(p: str) -> str:
    """``99.00`` -> ``p99``, ``99.90`` -> ``p999``, ``50.00`` -> ``p50``."""
    whole, _, frac = p.partition(".")
    frac = frac.rstrip("0")
    return f"p{whole}{frac}"


def figures(detail: dict[str, Any]) -> dict[str, Any]:
    """The record's figures from a detail log: validity and why, the scenario's metric, the
    early-stopping estimates, each percentile LoadGen reports (seconds), queries and rates."""
    scenario = str(detail.get("effective_scenario", ""))
    out: dict[str, Any] = {
        "loadgen_result": detail.get("result_validity"),
        "loadgen_invalid_reason": invalid_reason(detail),
        "loadgen_queries": detail.get("result_query_count"),
        "loadgen_samples_per_query": detail.get("effective_samples_per_query"),
        "loadgen_early_stopping_met": detail.get("early_stopping_met"),
        "loadgen_min_duration_met": detail.get("result_min_duration_met"),
    }
    per_query = scenario == "MultiStream"
    # The scenario's early-stopping estimate, None where too few queries ran for one.
    early = {"SingleStream": "loadgen_early_stopping_p90_s", "MultiStream": "loadgen_early_stopping_p99_s"}
    if scenario in early:
        out[early[scenario]] = None
    for key, value in detail.items():
        m = _PERCENTILE.fullmatch(key)
        if m and isinstance(value, (int, float)) and bool(m.group(2)) == per_query:
            out[f"loadgen_latency_{_percentile_name(m.group(1))}_s"] = value / 1e9
        elif key in _EARLY and isinstance(value, (int, float)) and value > 0:
            out[_EARLY[key]] = value / 1e9
    if isinstance(detail.get("result_mean_latency_ns"), (int, float)):
        out["loadgen_latency_mean_s"] = detail["result_mean_latency_ns"] / 1e9
    rates = {"Offline": "result_samples_per_second", "Server": "result_completed_samples_per_sec",
             "SingleStream": "result_qps_without_loadgen_overhead"}
    if isinstance(detail.get(rates.get(scenario, "")), (int, float)):
        out["loadgen_samples_per_s"] = float(detail[rates[scenario]])
    elif per_query and out.get("loadgen_latency_mean_s"):
        out["loadgen_samples_per_s"] = detail.get("effective_samples_per_query", 8) / out["loadgen_latency_mean_s"]
    out.update(token_figures(detail))
    if scenario == "Server":
        out["loadgen_scheduled_samples_per_s"] = detail.get("result_scheduled_samples_per_sec")
        out["loadgen_perf_constraints_met"] = detail.get("result_perf_constraints_met")
        out["loadgen_target_qps"] = detail.get("effective_target_qps")
    return out


def token_figures(detail: dict[str, Any]) -> dict[str, Any]:
    """A generation's figures (none where LoadGen timed no tokens): the time to first token's and
    per output token's percentiles and means, in seconds, and tokens/s (Offline's, or completed)."""
    if not detail.get("requested_use_token_latencies"):
        return {}
    out: dict[str, Any] = {}
    for key, value in detail.items():
        m = _TOKEN_PERCENTILE.fullmatch(key)
        if m and isinstance(value, (int, float)):
            first, per_token = m.groups()
            out[f"loadgen_{'ttft' if first else 'tpot'}_{_percentile_name(first or per_token)}_s"] = value / 1e9
        elif key in _TOKEN_MEANS and isinstance(value, (int, float)):
            out[_TOKEN_MEANS[key]] = value / 1e9
    rate = next((detail[k] for k in _TOKEN_RATES if isinstance(detail.get(k), (int, float))), None)
    out["loadgen_tokens_per_s"] = float(rate) if rate is not None else None
    return out


def invalid_reason(detail: dict[str, Any]) -> str | None:
    """Why LoadGen called a run INVALID, in one short line (None for a VALID run)."""
    if detail.get("result_validity") == "VALID":
        return None
    unmet = [name for key, name in (("result_min_duration_met", "min duration"),
                                    ("result_min_queries_met", "min queries"),
                                    ("early_stopping_met", "early stopping"),
                                    ("result_perf_constraints_met", "latency bound"))
             if detail.get(key) is False]
    said = " ".join(str(detail.get("result_invalid_reason") or "").split())
    text = ("not met: " + ", ".join(unmet) if unmet else "") + (f"; {said}" if said else "")
    return text.strip("; ")[:200] or "LoadGen gave no reason"


def headline(scenario: str, fig: dict[str, Any]) -> str:
    """The scenario's metric in words, as a closing line prints it."""
    def ms(key: str) -> str:
        v = fig.get(key)
        return f"{v * 1e3:.2f} ms" if isinstance(v, (int, float)) else "n/a"
    if scenario == "singlestream" and fig.get("loadgen_ttft_p90_s") is not None:
        text = f"p90 TTFT {ms('loadgen_ttft_p90_s')}, p90 TPOT {ms('loadgen_tpot_p90_s')}"
    elif scenario == "singlestream":
        text = f"p90 {ms('loadgen_latency_p90_s')} (early stopping {ms('loadgen_early_stopping_p90_s')})"
    elif scenario == "multistream":
        text = f"p99 per query {ms('loadgen_latency_p99_s')} (early stopping {ms('loadgen_early_stopping_p99_s')})"
    elif scenario == "offline":
        text = f"{fig.get('loadgen_samples_per_s') or 0:.1f} samples/s"
        if fig.get("loadgen_tokens_per_s") is not None:
            text += f", {fig['loadgen_tokens_per_s']:.1f} tokens/s"
    elif fig.get("loadgen_ttft_bound_s") is not None:
        qps = fig.get("loadgen_server_qps")
        bounds = f"p99 TTFT {fig['loadgen_ttft_bound_s'] * 1e3:g} ms and TPOT {fig['loadgen_tpot_bound_s'] * 1e3:g} ms"
        text = f"server rate {qps:.2f} q/s within {bounds}" if isinstance(qps, (int, float)) \
            else f"no rate within {bounds}"
    else:
        qps = fig.get("loadgen_server_qps")
        text = (f"server rate {qps:.2f} q/s within p99 {fig['loadgen_latency_bound_s'] * 1e3:g} ms"
                if isinstance(qps, (int, float)) else "no rate within the bound")
    why = fig.get("loadgen_invalid_reason")
    return f"{text}, LoadGen {fig.get('loadgen_result')}" + (f" ({why})" if why else "")
