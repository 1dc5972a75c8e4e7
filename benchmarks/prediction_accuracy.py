#!/usr/bin/env python3
"""How well the cost model predicts a real sweep on this machine (a measurement, not a test).

Both cores are profiled (one thread each, as the sweeper pins its stages), a small sweep runs
MobileNetV2 at six splits under ``lan`` and a 5 ms / 40 Mbit/s link, both cores are profiled
again, and ``paretopipe.predict.validate`` compares the sweep with the averaged profiles. Each
stage is predicted from the profile of its own core: the local stand-in for one profile per
device. Printed: the median absolute percentage errors of latency and throughput, the front
Jaccard per network, and the goal (15% median error for stages on separate devices; co-located
stages share a cache, so interior splits run slower than their profiles here), plus the profile's
own consistency (segments summed over the whole model, per profile).

It used to be a test with a bound set to the noise of the day (15%, then 35%, then 50%): it
failed CI at random. The mechanism is tested exactly in tests/predict/test_validate.py.

    python benchmarks/prediction_accuracy.py            # about 3 minutes here
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

from paretopipe.predict import validate as predict
from paretopipe.predict.device_profile import DeviceProfile

ROOT = Path(__file__).resolve().parents[1]
NETWORKS = '[lan]\n\n[slow]\ndelay = "5ms"\nrate = "40mbit"\n'


def _profile(path: Path, core: int) -> dict:
    subprocess.run([sys.executable, "-m", "paretopipe.profile", "--model", "mobilenetv2", "--threads", "1", "--cpus",
                    str(core), "--repetitions", "9", "--codecs", "float32/none", "--out", str(path), "--quiet"],
                   cwd=ROOT, check=True)
    return json.loads(path.read_text())


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--num-batches", type=int, default=8)
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        (folder / "networks.toml").write_text(NETWORKS)
        docs = [_profile(folder / f"before{core}.json", core) for core in (0, 1)]
        subprocess.run([sys.executable, "automated_split_tester.py", "--model", "mobilenetv2", "--splits",
                        "0,3,8,12,16,19", "--runs", "1", "--network", "lan,slow", "--network-file",
                        str(folder / "networks.toml"), "--batch-size", "1", "--num-batches", str(args.num_batches),
                        "--warmup", "1", "--in-flight", "1", "--out", str(folder / "out"), "--session", "s",
                        "--no-report", "--local", "--quiet"], cwd=ROOT, check=True)
        docs += [_profile(folder / f"after{core}.json", core) for core in (0, 1)]
        profiles = [DeviceProfile.load_spec(f"{folder / f'before{core}.json'}+{folder / f'after{core}.json'}")
                    for core in (0, 1)]
        table, summary = predict.validate(folder / "out" / "s", profiles)
    print(table[["network", "split_index", "latency_s", "predicted_latency_s", "throughput_imgs_per_s",
                 "predicted_throughput_imgs_per_s"]].to_string(index=False, float_format=lambda v: f"{v:.4g}"))
    for doc, name in zip(docs, ("core 0 before", "core 1 before", "core 0 after", "core 1 after")):
        per = doc["by_batch"]["1"]
        print(f"profile {name}: segments sum to {sum(per['segment_compute_s']) / per['whole_model_s']:.2f} of the "
              f"whole model (1.00 on a quiet machine)")
    print(f"latency median APE {summary['latency_median_ape']:.3f}, throughput median APE "
          f"{summary['throughput_median_ape']:.3f} (goal <= {predict.GOAL_MAPE} for separate devices)")
    for name, net in summary["per_network"].items():
        print(f"  {name}: front Jaccard {net['jaccard']:.2f} (goal >= {predict.GOAL_JACCARD}), predicted "
              f"{net['predicted_front']}, measured {net['measured_front']} tied {net['measured_tied']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
