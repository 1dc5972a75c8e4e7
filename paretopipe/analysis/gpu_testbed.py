"""The one-page summary of ``scripts/gpu_testbed.sh``: the emulated Pi's calibration, each model's
knee split per network, the server's (stage 2's) share of each split's time, energy where NVML
measured it, and the language model's time to first token and per token at each cut.

    python -m paretopipe.analysis.gpu_testbed OUTDIR      # prints the summary (Markdown)"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Sequence

import pandas as pd

from .. import workload
from ..errors import UsageError


def _sessions(root: Path) -> list[Path]:
    return sorted(p.parent.parent for p in root.rglob("report/pareto.csv"))


def _ms(value: float) -> str:
    return "n/a" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{value * 1e3:.1f}"


def _server_share(row: pd.Series) -> float:
    """Stage 2's compute over the latency: how much of a split's time the server takes."""
    return row["stage2_compute_median_s"] / row["latency_median_s"] if row["latency_median_s"] else float("nan")


def image_section(table: pd.DataFrame) -> list[str]:
    """Knees per model and network, then every split's server share (stage 2's compute over the
    latency) and energy per image."""
    lines = ["| model | network | knee split | latency at the knee (ms) | server's share there |", "|---|---|---|---|---|"]
    for (model, network), g in table.groupby(["model", "network"]):
        knee = g[g["knee"].astype(bool)]
        for _, row in knee.iterrows():
            lines.append(f"| {model} | {network} | {int(row['split_index'])} | {_ms(row['latency_median_s'])} | "
                         f"{_server_share(row):.0%} |")
    lines += ["", "Every split, lan (the server's share of the latency; the server GPU's energy per image where NVML "
              "measured it, net of its idle):", "",
              "| model | split | latency (ms) | server's share | server GPU energy per image (J) |", "|---|---|---|---|---|"]
    shown = table[table["network"] == ("lan" if "lan" in set(table["network"]) else table["network"].iloc[0])]
    for _, row in shown.sort_values(["model", "split_index"]).iterrows():
        lines.append(f"| {row['model']} | {int(row['split_index'])} | {_ms(row['latency_median_s'])} | "
                     f"{_server_share(row):.0%} | {_gpu_energy(row)} |")
    return lines + _energy_note(shown)


def _gpu_energy(row: pd.Series) -> str:
    """Stage 2's NVML energy per image: a window that drew less than the idle measured at start-up
    is said to, not printed negative (stage2_energy_below_idle)."""
    if bool(row.get("stage2_energy_below_idle", False)):
        return "below idle"
    energy = row.get("stage2_energy_per_image_j", float("nan"))
    return "n/a (no NVML)" if pd.isna(energy) else format(energy, ".3f")


def _energy_note(rows: pd.DataFrame) -> list[str]:
    """How far the energy figures can be read: on a 2026-11-30 H200, four batches' windows of
    26-516 ms drew less than idle in half the splits and ranged 0.05-1.8 J with no order by split."""
    if "stage2_energy_window_s" not in rows or rows["stage2_energy_window_s"].isna().all():
        return []
    window = rows["stage2_energy_window_s"].dropna()
    below = int(rows.get("stage2_energy_below_idle", pd.Series(dtype=bool)).fillna(False).astype(bool).sum())
    return ["", f"Each energy figure is one window of NVML's total-energy counter, {window.min() * 1e3:.0f} to "
                f"{window.max() * 1e3:.0f} ms; {below} of {len(rows)} drew less than the idle measured at start-up. "
                f"Windows this short are too short to rank splits by energy: more batches (--num-batches) lengthen them."]


def generation_section(table: pd.DataFrame) -> list[str]:
    lines = ["| model | network | cut | time to first token (ms) | time per token (ms) | knee |", "|---|---|---|---|---|---|"]
    for _, row in table.sort_values(["model", "network", "split_index"]).iterrows():
        lines.append(f"| {row['model']} | {row['network']} | {int(row['split_index'])} | {_ms(row['ttft_median_s'])} | "
                     f"{_ms(row['tpot_median_s'])} | {'knee' if bool(row['knee']) else ''} |")
    return lines


def _devices(session: Path) -> str:
    """Where each stage computed, from a run's manifest (a GPU's name where it had one)."""
    run = next(iter(sorted((session / "runs").glob("*.json"))), None)
    if run is None:
        return "no run records"
    stages = json.loads(run.read_text())["manifest"]["stages"]
    return "stages on " + ", ".join(f"{s.get('role', i + 1)}: {s.get('gpu_name') or s.get('device')}"
                                    for i, s in enumerate(stages))


def _calibration_line(c: dict) -> str:
    """What stage 1 emulated: the share and the times it rests on (a share held at 1 says that
    this core is no faster than the Pi, so stage 1 runs slower than one)."""
    pi, host = _ms(c["pi4_resnet18_s"]), _ms(c["emulated_resnet18_s"])
    if c["share"] >= 1:
        how = (f"held to a CPU share of {c['share']:.3f}: this core is no faster than a Pi 4 (ResNet-18 takes {host} "
               f"ms here against the Pi's published {pi} ms), so stage 1 is slower than the Pi")
    else:
        how = f"held to a CPU share of {c['share']:.3f}, at which ResNet-18 takes {host} ms, the Pi's published {pi} ms"
    return (f"Stage 1 is an emulated Raspberry Pi 4: one core {how} ({c['source']}); MobileNetV2 then takes "
            f"{_ms(c['emulated_mobilenet_v2_s'])} ms.")


def summary(root: Path) -> str:
    """The summary of every session under ``root`` (and its calibration.json)."""
    sessions = _sessions(root)
    if not sessions:
        raise UsageError(f"{root}: no sweep sessions with a report under it (scripts/gpu_testbed.sh writes them)")
    out = ["# The testbed in one box", ""]
    calibration = root / "calibration.json"
    if calibration.is_file():
        out += [_calibration_line(json.loads(calibration.read_text())), ""]
    for session in sessions:
        table = pd.read_csv(session / "report" / "pareto.csv")
        out += [f"## {session.relative_to(root)}", "", f"{len(table)} configurations; {_devices(session)}.", ""]
        out += generation_section(table) if workload.of_table(table).generates else image_section(table)
        out.append("")
    return "\n".join(out)


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 1:
        raise UsageError("usage: python -m paretopipe.analysis.gpu_testbed OUTDIR")
    print(summary(Path(args[0])))
    return 0


if __name__ == "__main__":
    try:
        raise SystemExit(main())
    except UsageError as exc:
        print(f"error: {exc}", file=sys.stderr)
        raise SystemExit(2)
