"""The traces the project ships, generated from a documented model (no recorded data is shipped).

``markov-cellular`` is a Markov-modulated rate: a discrete-time chain over three states (good,
fair and poor coverage) stepped every 100 ms. In each step the chain stays with probability
``STAY`` and otherwise moves to one of the other states with equal probability; within a state
the rate is the state's mean times a log-normal factor (sigma ``SIGMA``) drawn per step, so the
capacity swings about tenfold between poor and good coverage, as cellular uplinks do. It is
written in Mahimahi's format (delivery opportunities in milliseconds), one file per direction.

``step`` is a square wave for tests and the adaptive-split demo: a fast rate and a slow one,
alternating every ``STEP_S`` seconds, in the CSV format.

``python -m paretopipe.network.tracegen DIR`` writes them; the shipped copies under
``paretopipe/network/traces/`` are exactly this output (a test regenerates and compares).
"""

from __future__ import annotations

import argparse
import math
import random
import sys
from pathlib import Path
from typing import Sequence

from .traces import PACKET_BYTES

STEP_MS = 100
STAY = 0.97
SIGMA = 0.25
STATES_MBIT = {"up": (12.0, 4.0, 0.8), "down": (24.0, 8.0, 1.6)}  # good, fair, poor
LENGTH_S = 30
STEP_S = 4
STEP_MBIT = (40.0, 2.0)


def markov_rates(seed: int, states: Sequence[float], length_s: float = LENGTH_S) -> list[float]:
    """Rates in Mbit/s, one per 100 ms step."""
    rng = random.Random(seed)
    state = 0
    out = []
    for _ in range(int(length_s * 1000 / STEP_MS)):
        if rng.random() > STAY:
            state = rng.choice([s for s in range(len(states)) if s != state])
        out.append(states[state] * math.exp(rng.gauss(0.0, SIGMA) - SIGMA ** 2 / 2))
    return out


def mahimahi_lines(rates_mbit: Sequence[float]) -> list[str]:
    """Delivery opportunities for per-step rates: one line per 1500-byte packet, in whole ms, with
    the capacity integral carried across steps; the last line closes the period."""
    lines: list[str] = []
    bits = 0.0
    sent = 0
    for step, rate in enumerate(rates_mbit):
        start = step * STEP_MS
        bits_end = bits + rate * 1e6 * STEP_MS / 1e3
        while (sent + 1) * PACKET_BYTES * 8 <= bits_end:
            t = start + ((sent + 1) * PACKET_BYTES * 8 - bits) / (rate * 1e6) * 1e3
            lines.append(str(int(t)))
            sent += 1
        bits = bits_end
    lines.append(str(len(rates_mbit) * STEP_MS))
    return lines


def step_csv() -> str:
    fast, slow = STEP_MBIT
    rows = ["time_s,rate_mbit"] + [f"{i * STEP_S},{fast if i % 2 == 0 else slow:g}" for i in range(4)]
    return "\n".join(rows) + "\n"


def write(folder: Path) -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    for which, seed in (("up", 1), ("down", 2)):
        path = folder / f"markov-cellular.{which}"
        path.write_text("\n".join(mahimahi_lines(markov_rates(seed, STATES_MBIT[which]))) + "\n")
        written.append(path)
    path = folder / "step.csv"
    path.write_text(step_csv())
    written.append(path)
    return written


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m paretopipe.network.tracegen", description=__doc__.split("\n\n")[0])
    ap.add_argument("folder", type=Path)
    args = ap.parse_args(argv)
    for path in write(args.folder):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
