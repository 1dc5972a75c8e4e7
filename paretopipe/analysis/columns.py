"""The columns of a session's tables: runs.csv's row of a run record, the figures each kind of run
adds (a stage's time breakdown, energy and memory, LoadGen's, a generation's), and what
failures.csv holds."""

from __future__ import annotations

import re
from typing import Any

from .. import faults, workload
from ..network.labels import link_label
from .keys import CLOSED_LOOP, DEFAULT_ENGINE, PLAIN, RAW_TCP, split_label

RUN_FIELDS = ["run_key", "config_key", "model", "workload", "backend", "network", "split_index", "cut", "run", "status",
              "batch_size", "in_flight", "cipher", "transport", "codec", "scenario", "latency_median_s", "latency_mean_s", "latency_p95_s",
              "throughput_imgs_per_s", "transfer_median_s", "stage1_compute_median_s",
              "stage2_compute_median_s", "stage2_queue_median_s", "payload_bytes_mean", "wire_bytes_mean",
              "goodput_mbit_per_s", "result_wire_bytes_mean", "measured_window_s", "measured_span_s",
              "batches_measured", "link_mode", "throttled", "error", "json"]
FAILURE_FIELDS = ["run_key", "attempt", "error", "time_utc"]
#: Per-batch means of the latency's parts (every stage's compute, codecs and queue, the transfer):
#: they add up to ``latency_mean_s`` exactly, so the breakdown figure stacks them.
BREAKDOWN = re.compile(r"^(stage\d+_(compute|encode|decode|queue|seal|open)|result_(decode|open)|transfer)_mean_s$")
#: A run's energy and memory figures (energy.summary): runs.csv keeps each; summary.csv gives the
#: objectives (joules per image or token, peak memory) a median with a 95% CI over runs, the rest a median.
RESOURCES = re.compile(r"^(stage\d+_|link_)?(energy_\w+|idle_power_w|cpu_s|peak_rss_bytes|param_bytes|"
                       r"activation_peak_bytes|model_bytes|cuda_peak_bytes|memory_limit_bytes|over_memory_limit|"
                       r"memory_peak_bytes|memory_model_bytes|memory_fits)$")
RESOURCE_OBJECTIVE = re.compile(r"^((stage\d+_)?energy(_modelled)?_per_(image|token)_j|(stage\d+_)?(peak_rss|model)_bytes|"
                                r"memory_(peak|model)_bytes)$")
#: A generation's figures (paretopipe.llm.summary): its workload, its token times and rates, each
#: stage's compute per phase and KV cache, each cut's bytes, what comes back and in how many round
#: trips, a peer engine's own timings (llama-server's), and what a lossy wire cost.
GENERATION = re.compile(r"^(prompt_len|gen_tokens|streams|tokens_generated|ttft_(median|p90|max)_s|"
                        r"tpot_(median|p90|p99)_s|(decode_)?tokens_per_s|(down_)?bytes_per_token|prefill_bytes|"
                        r"round_trips_per_token|server_(ttft|tpot)_median_s|"
                        r"token_agreement|max_logit_diff|tpot_bound_s|tpot_over_bound|"
                        r"stage\d+_(prefill|decode)_compute_median_s|stage\d+_kv_bytes|hop\d+_(prefill_bytes|bytes_per_token))$")
#: What a lossy wire cost (paretopipe.transport.fidelity): the evaluation pass after the timed
#: batches, the same in every run of a configuration (its inputs and arithmetic are deterministic).
FIDELITY = re.compile(r"^(fidelity_(samples|top1_agreement|kl_mean|eval_s|error)|accuracy_top1(_float32)?|"
                      r"perplexity(_float32)?|engine_max_rel_error)$")
#: What a fault cost a run (paretopipe.faults): runs.csv keeps each, summary.csv their medians.
FAULT = faults.COLUMNS
#: A generation's figures that summary.csv gives a median with a 95% CI over runs (its fronts' axes):
#: each one's CI columns are ``<stem>_ci95_low<unit>`` and ``..._high<unit>``.
GENERATION_OBJECTIVES = {"ttft_median_s": ("ttft", "_s"), "tpot_median_s": ("tpot", "_s"),
                         "tokens_per_s": ("tokens", "_per_s")}


def run_row(rec: dict[str, Any], name: str) -> dict[str, Any]:
    """One runs.csv row from a run record (the record's own fields, never its file name)."""
    s, c = rec["summary"], rec["config"]
    generation = c.get("generation") or {}
    return {"run_key": c.get("run_key") or rec["run_id"], "config_key": c.get("config_key") or rec["run_id"],
            "model": c["model"], "backend": rec["backend"],
            "network": c.get("network") or link_label(rec["manifest"]["link"]),
            "split_index": split_label(c.get("split_index")), "cut": ",".join(c.get("cuts", [])), "run": c.get("run"),
            "status": rec["status"], "batch_size": c["batch_size"], "in_flight": c["in_flight"],
            "cipher": cipher_of(rec["manifest"]), "transport": transport_of(rec["manifest"]),
            "codec": f"{codec_dtype(c)}/{c.get('compression') or 'none'}",
            "scenario": (c.get("loadgen") or {}).get("scenario") or CLOSED_LOOP,
            **({"fault": faults.Fault(**c["fault"]).label} if c.get("fault") else {}),
            **({"placement": str(c["placement"])} if c.get("placement") else {}),
            "engine": c.get("engine") or DEFAULT_ENGINE, **engine_error(rec["manifest"]),
            workload.FIELD: workload.of_record(rec).name,
            **{k: s.get(k) for k in RUN_FIELDS if k in s},
            **({"prompt_len": prompt_len(rec), "gen_tokens": generation.get("gen_tokens")} if generation else {}),
            **{k: v for k, v in s.items() if k.startswith("loadgen_")},
            **{k: v for k, v in s.items() if _extra(k) and k != "fault"},
            "link_mode": rec["manifest"]["link"].get("mode"), "throttled": _throttled(rec.get("sysmon")),
            "error": rec.get("error"),
            "json": name}


def codec_dtype(config: dict[str, Any]) -> str:
    """The wire dtype a configuration is keyed by: ``auto`` where stage 1 chose one to a target
    (the record's ``wire_dtype`` is the one it chose, ``wire_choice`` the evidence)."""
    return "auto" if config.get("wire_choice") else config.get("wire_dtype") or "float32"


def prompt_len(rec: dict[str, Any]) -> int | None:
    """A generation's prompt tokens per stream: its seeded length, else the longest prompt it ran."""
    g = rec["config"].get("generation") or {}
    if g.get("prompt_len"):
        return int(g["prompt_len"])
    lengths = (rec.get("generation") or {}).get("prompt_tokens") or []
    return max(lengths) if lengths else None


def extra_columns(rows: list[dict[str, Any]]) -> list[str]:
    """runs.csv's columns beyond :data:`RUN_FIELDS`: those some row has (a stage's breakdown,
    energy and memory, a generation's figures, a lossy wire's evaluation, a fault and its cost)."""
    return sorted({k for r in rows for k in r if k not in RUN_FIELDS and _extra(k)})


def _extra(column: str) -> bool:
    return column in ("fault", "placement", "engine") or any(p.match(column) for p in (BREAKDOWN, RESOURCES, GENERATION, FIDELITY,
                                                                            FAULT))


def engine_error(manifest: dict[str, Any]) -> dict[str, float]:
    """``engine_max_rel_error``: the largest of the run's engine stages' errors against their torch
    stages (paretopipe.partition.onnxstage); none where every stage ran torch."""
    errors = [stage["engine"]["max_rel_error"] for stage in manifest.get("stages") or []
              if isinstance(stage, dict) and isinstance(stage.get("engine"), dict)
              and isinstance(stage["engine"].get("max_rel_error"), (int, float))]
    return {"engine_max_rel_error": max(errors)} if errors else {}


def cipher_of(manifest: dict[str, Any]) -> str:
    """The cipher a run's data port used (``none``: plain; records from before encryption say
    nothing): what ``--encrypt auto`` resolved to, not the choice."""
    for stage in manifest.get("stages") or []:
        cipher = stage.get("cipher") if isinstance(stage, dict) else None
        if isinstance(cipher, dict) and isinstance(cipher.get("cipher"), str):
            return cipher["cipher"]
    return PLAIN


def transport_of(manifest: dict[str, Any]) -> str:
    """The transport a run's data port used (``tcp``: raw sockets; records from before transports,
    and RPC runs, say nothing)."""
    for stage in manifest.get("stages") or []:
        used = stage.get("transport") if isinstance(stage, dict) else None
        if isinstance(used, dict) and isinstance(used.get("transport"), str):
            return used["transport"]
    return RAW_TCP


def _throttled(sysmon: Any) -> bool | None:
    """True when any stage saw its CPU throttled during the run (None: nobody could tell)."""
    flags = [v.get("throttled") for v in (sysmon or {}).values() if isinstance(v, dict)]
    known = [f for f in flags if f is not None]
    return any(known) if known else None
