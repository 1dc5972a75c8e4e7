"""A run's energy and memory figures, from its stages' ``resources`` parts.

Measured energy: each stage's sensors over its window, the device total (every sensor's ``total``
channel), less the device's idle power over the window (``net``), per image. The pipeline's
joules per image add up the stages whose sensors differ; two stages on one host read the same
sensors, which count once (stage 1's window, which holds the other's). Modelled energy, for a
stage whose host has no sensor but declares its powers: CPU seconds x the power one busy core
adds (the net part), plus idle power x the window (the gross figure). The two never share a
column: every modelled name says ``modelled``.
"""

from __future__ import annotations

from typing import Any

#: Channels reported beside the total: a CPU rail (a Pi 5's VDD_CORE, RAPL's core zone) and DRAM.
_RAILS = {"cpu": ("cpu", "core"), "dram": ("dram",)}


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) and value == value else None


def _measured(stage: dict[str, Any]) -> dict[str, Any] | None:
    """(gross J, idle W, per-rail J, samples) of one stage's sensors over its window, or None."""
    energy = stage.get("energy") or {}
    window = energy.get("window") or {}
    if not energy.get("sensors") or not window:
        return None
    total, rails, samples = 0.0, {}, []
    for name, w in window.items():
        joules = (w or {}).get("joules")
        if not isinstance(joules, dict) or _number(joules.get("total")) is None:
            return None
        total += joules["total"]
        samples.append(int(w.get("samples") or 0))
        for rail, keys in _RAILS.items():
            for key in keys:
                if _number(joules.get(key)) is not None:
                    rails[rail] = rails.get(rail, 0.0) + joules[key]
    idle = sum(_number((v or {}).get("total")) or 0.0 for v in (energy.get("idle_w") or {}).values())
    return {"gross": total, "idle_w": idle, "rails": rails, "samples": min(samples, default=0),
            "rate_hz": _number(energy.get("rate_hz"))}


def _bytes(value: Any) -> int | None:
    number = _number(value)
    return int(number) if number is not None else None


def _sensor_key(stage: dict[str, Any], manifest: dict[str, Any] | None) -> tuple:
    host = (manifest or {}).get("hostname")
    return (host, tuple(sorted(s.get("path", "") for s in (stage.get("energy") or {}).get("sensors") or [])))


def link_energy(link: dict[str, Any], summary: dict[str, Any], batch_size: int) -> dict[str, Any]:
    """The link's modelled energy per image: the bits each way x the network's declared nanojoules
    per bit (``energy_nj_per_bit`` with its ``energy_source``); nothing where none is declared."""
    conditions = link.get("conditions") or link.get("conditions_requested") or {}
    up, down = (conditions.get(d) or {} for d in ("up", "down"))
    rates = [_number(up.get("energy_nj_per_bit")), _number(down.get("energy_nj_per_bit"))]
    if all(r is None for r in rates) or not batch_size:
        return {}
    sent = [_number(summary.get("wire_bytes_mean")) or 0.0, _number(summary.get("result_wire_bytes_mean")) or 0.0]
    joules = sum(8 * nbytes * (rate or 0.0) * 1e-9 for nbytes, rate in zip(sent, rates))
    return {"link_energy_modelled_per_image_j": joules / batch_size,
            "link_energy_source": str(conditions.get("energy_source") or "")[:200]}


def _memory_fields(mem: dict[str, Any], declared_limit: Any) -> dict[str, Any]:
    """One stage's memory summary (without its ``stageN_`` prefix): peak RSS, parameters and
    activations, the CUDA peak, and its limit (the stage's own, else the declared one) with
    whether the peak went over it."""
    peak = _bytes(mem.get("peak_rss_bytes"))
    limit = _bytes(mem.get("limit_bytes"))
    if limit is None:
        limit = _bytes(declared_limit)
    out: dict[str, Any] = {"peak_rss_bytes": peak, "param_bytes": _bytes(mem.get("param_bytes")),
                           "activation_peak_bytes": _bytes(mem.get("activation_peak_bytes"))}
    if out["param_bytes"] is not None and out["activation_peak_bytes"] is not None:
        # The split's own footprint on this stage: what a deployment that loads only its part
        # adds to the runtime (a sweep's worker keeps the whole model, so its RSS cannot show it).
        out["model_bytes"] = out["param_bytes"] + out["activation_peak_bytes"]
    if _bytes(mem.get("cuda_peak_bytes")) is not None:
        out["cuda_peak_bytes"] = _bytes(mem["cuda_peak_bytes"])
    if limit is not None:
        out["memory_limit_bytes"] = limit
        out["over_memory_limit"] = bool(peak is not None and peak > limit)
    return out


def _net_energy(got: dict[str, Any], window: float) -> float | None:
    """The window's energy less the idle power over it; None where the device drew less in the
    window than the idle power measured before the run. A GPU does when its clocks fall while it
    waits on the link: its idle was measured in the higher power state its start-up left it in, so
    no figure net of idle can be told from that measurement (the gross joules and the mean power
    stay in the summary)."""
    net = got["gross"] - got["idle_w"] * window
    return net if net >= 0 else None


def summarize(resources: dict[str, Any] | None, stages: list[dict[str, Any]], config: dict[str, Any]
              ) -> dict[str, Any]:
    """Summary fields of the energy and memory of a run (``stageN_*`` per stage, the pipeline's
    without a prefix); nothing for a record without ``resources``."""
    if not resources:
        return {}
    out: dict[str, Any] = {}
    powers_idle = config.get("power_idle_w") or []
    powers_core = config.get("power_core_w") or []
    limits = config.get("memory_limits") or []
    measured_total: float | None = 0.0
    modelled_total: float | None = 0.0
    seen: set[tuple] = set()
    mems: list[dict[str, Any]] = []
    names = sorted(resources, key=lambda n: int(n[5:]) if n[5:].isdigit() else 99)
    for name in names:
        stage = resources[name] or {}
        j = int(name[5:]) if name[5:].isdigit() else None
        if j is None:
            continue
        p = f"stage{j}_"
        mems.append(_memory_fields(stage.get("memory") or {}, limits[j - 1] if j <= len(limits) else None))
        out.update({p + k: v for k, v in mems[-1].items()})
        images = _number(stage.get("images")) or 0
        window, cpu = _number(stage.get("window_s")), _number(stage.get("cpu_s"))
        got = _measured(stage)
        if got is not None and window and images:
            net = _net_energy(got, window)
            out.update({p + "energy_j": got["gross"], p + "energy_net_j": net, p + "idle_power_w": got["idle_w"],
                        p + "energy_mean_power_w": got["gross"] / window, p + "energy_below_idle": net is None,
                        p + "energy_per_image_j": None if net is None else net / images, p + "energy_window_s": window,
                        p + "energy_samples": got["samples"], p + "energy_rate_hz": got["rate_hz"]})
            for rail, joules in got["rails"].items():
                out[f"{p}energy_{rail}_j"] = joules
            key = _sensor_key(stage, stages[j - 1] if j - 1 < len(stages) else None)
            if net is None:
                measured_total = None
            elif key not in seen and measured_total is not None:
                measured_total += net / images
            seen.add(key)
        else:
            measured_total = None
        core = _number(powers_core[j - 1]) if j <= len(powers_core) else None
        idle = (_number(powers_idle[j - 1]) if j <= len(powers_idle) else None) or 0.0
        if core is not None and window and cpu is not None and images:
            out.update({p + "energy_modelled_j": cpu * core + idle * window,
                        p + "energy_modelled_per_image_j": cpu * core / images, p + "cpu_s": cpu})
            if modelled_total is not None:
                modelled_total += cpu * core / images
        else:
            modelled_total = None
    if names:
        out["energy_per_image_j"] = measured_total
        out["energy_modelled_per_image_j"] = modelled_total
    peaks, models = ([m[k] for m in mems if m.get(k) is not None] for k in ("peak_rss_bytes", "model_bytes"))
    over = [m["over_memory_limit"] for m in mems if "over_memory_limit" in m]
    out["memory_peak_bytes"] = max(peaks) if peaks else None
    out["memory_model_bytes"] = max(models) if models else None
    out["memory_fits"] = (not any(over)) if over else None
    return out
