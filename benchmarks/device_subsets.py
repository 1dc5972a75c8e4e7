#!/usr/bin/env python3
"""Which devices to use, measured beside the prediction, for a language model on a three-host lab.

The lab's hosts are network namespaces with their own sshd; host 3 is held to a quarter of a core
(``lab up --host-cpu 1,1,0.25``), so everything started there over SSH is a slower device. Each
host profiles the model itself (``paretopipe profile`` over SSH: the slow host's profile is slow
for real); the cost model prices every placement (h1 first, every ordered subset of h2 and h3
after it) and its plan of least time per token; one sweep over ``--placements all`` then runs
those plans, each on every placement of as many hosts, and its report says what the third device
bought; ``predict --subsets --validate`` prints the predicted and measured gains side by side.
The last line says what the third device does to the time per token, predicted and measured.
Needs root (the lab).

    sudo python benchmarks/device_subsets.py                        # smollm2-135m's shape (minutes)
    sudo python benchmarks/device_subsets.py --model tiny-lm --prompt-len 16
"""

from __future__ import annotations

import argparse
import csv
import json
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path

from paretopipe.envfile import read_env
from paretopipe.llm import shapes
from paretopipe.network.conditions import get_conditions
from paretopipe.predict import lm_costmodel, subsets
from paretopipe.controller import lab
from paretopipe.controller.hosts import Testbed

ROOT = Path(__file__).resolve().parents[1]

NAMES = ["h1", "h2", "h3"]


def _profiles(made: lab.Lab, model: str, prompt: int, tmp: Path) -> list[Path]:
    """Each host's own profile of the model, taken there over SSH (one torch thread)."""
    hosts = Testbed.from_env(read_env(str(made.env_file))).hosts
    out = []
    for name, host in zip(NAMES, hosts):
        path = tmp / f"{name}.json"
        command = shlex.join([sys.executable, "-m", "paretopipe", "profile", "--model", model, "--prompt-len",
                              str(prompt), "--threads", "1", "--out", str(path)])
        subprocess.run(host.ssh() + [f"cd {shlex.quote(str(ROOT))} && {command}"], check=True,
                       stdout=subprocess.DEVNULL)
        out.append(path)
    return out


def _measure(devices: Path, model: str, prompt: int, priced: list[subsets.Placement], tmp: Path, runs: int) -> Path:
    """Every placement's plan of least predicted time per token, each run on every placement of as
    many hosts, in one session over --placements all (its report says what each extra device bought)."""
    plans = dict.fromkeys(",".join(map(str, p.figure("tpot")[1])) for p in priced)
    subprocess.run([sys.executable, str(ROOT / "automated_split_tester.py"), "--env-file", str(devices), "--model",
                    model, "--split-blocks", ";".join(plans), "--placements", "all", "--network", "lan", "--link",
                    "emulated", "--prompt-len", str(prompt), "--gen-tokens", "16", "--runs", str(runs), "--threads",
                    "1", "--drift-every", "0", "--out", str(tmp / "out"), "--session", "placed", "--quiet"],
                   check=True, stdout=subprocess.DEVNULL)
    return tmp / "out" / "placed"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--prompt-len", type=int, default=32)
    p.add_argument("--runs", type=int, default=2)
    p.add_argument("--host-cpu", default="1,1,0.25", help="each host's CPU share (lab up --host-cpu)")
    args = p.parse_args()
    shares = [float(x) for x in args.host_cpu.split(",")]
    shape = shapes.named(args.model)
    made = lab.up("ppbench", 3, 71, cpu=shares)
    try:
        with tempfile.TemporaryDirectory() as tmpdir:
            tmp = Path(tmpdir)
            devices = made.env_for([1, 2, 3], tmp / "lab.env")
            paths = _profiles(made, args.model, args.prompt_len, tmp)
            profiles = [lm_costmodel.load_profile(x) for x in paths]
            priced = subsets.price_generation(shape, profiles, get_conditions("lan"), args.prompt_len)
            session = _measure(devices, args.model, args.prompt_len, priced, tmp, args.runs)
            out = subprocess.run([sys.executable, "-m", "paretopipe", "predict", "--model", args.model,
                                  "--device-profiles", ",".join(map(str, paths)), "--network", "lan", "--prompt-len",
                                  str(args.prompt_len), "--subsets", "--env-file", str(devices), "--validate",
                                  str(session), "--out", str(tmp / "pred")],
                                 check=True, capture_output=True, text=True, cwd=ROOT)
            print(f"{args.model}, prompt {args.prompt_len}, 16 tokens, {args.runs} runs, hosts' CPU shares {args.host_cpu}")
            print(out.stdout.strip())
            print(f"the session's report ({session / 'report' / 'devices.csv'}):")
            print((session / "report" / "devices.csv").read_text().strip())
            with open(tmp / "pred" / "subsets.csv") as fh:
                third = next(r for r in csv.DictReader(fh) if r["objective"] == "tpot" and r["devices"] == "3")
    finally:
        lab.down("ppbench")
    print(json.dumps({k: third[k] for k in ("placement", "value", "vs_one_fewer", "gain", "measured_placement",
                                             "measured_value", "measured_vs_one_fewer", "measured_gain", "agrees")}))
    print(f"device_subsets: a third device's time per token x{float(third['vs_one_fewer']):.3f} predicted "
          f"({third['gain']}), x{float(third['measured_vs_one_fewer']):.3f} measured ({third['measured_gain']}): "
          f"{'agree' if third['agrees'] == 'True' else 'disagree'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
