"""A search worker for the shared-study tests: a real process that joins ``--study URL`` and
measures configurations of a small modelled space, logging each measurement it starts and ends
(``start``/``done`` lines with its testbed and the configuration) so that the test can tell who
measured what, and kill a worker in the middle of a measurement (``--hang-first``)."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from paretopipe.errors import UsageError
from paretopipe.search import loop
from paretopipe.search.space import Dimension, Space
from paretopipe.search.study import StudySpec, identity

OBJECTIVES = {"latency": "min", "throughput": "max"}
SPACE = Space((Dimension("split", tuple(range(10)), ordered=True), Dimension("network", ("lan", "lte"))))


def values(config: tuple) -> tuple[float, float]:
    split, network = config
    slow = 3.0 if network == "lte" else 1.0
    return (0.01 * (split - 4) ** 2 * slow + 0.02, 100.0 / (1 + abs(split - 6)) / slow)


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--study", required=True)
    p.add_argument("--name", default="toy")
    p.add_argument("--testbed", required=True)
    p.add_argument("--budget", type=int, required=True)
    p.add_argument("--log", required=True)
    p.add_argument("--seconds", type=float, default=0.3, help="each measurement's duration")
    p.add_argument("--hang-first", action="store_true", help="never finish the first measurement")
    p.add_argument("--model", default="toy")
    p.add_argument("--objectives", default="latency:min,throughput:max")
    p.add_argument("--grace-s", type=float, default=None)
    args = p.parse_args()
    log = Path(args.log)
    objectives = dict(o.split(":") for o in args.objectives.split(","))
    spec = StudySpec(args.study, args.name, args.testbed,
                     identity(args.model, objectives, {d.name: d.choices for d in SPACE.dims}))
    if args.grace_s is not None:
        spec = StudySpec(spec.url, spec.name, spec.testbed, spec.identity, heartbeat_s=1, grace_s=args.grace_s)
    count = [0]

    def evaluate(config: tuple) -> tuple[float, ...]:
        with log.open("a") as f:
            f.write(f"start {args.testbed} {config[0]} {config[1]}\n")
        count[0] += 1
        time.sleep(3600 if args.hang_first and count[0] == 1 else args.seconds)
        with log.open("a") as f:
            f.write(f"done {args.testbed} {config[0]} {config[1]}\n")
        return values(config)[:len(objectives)]

    try:
        result = loop.search(SPACE, evaluate, objectives, args.budget, "tpe", seed=hash(args.testbed) % 1000,
                             startup=4, shared=spec)
    except UsageError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"measured {len(result.trials)} study {result.study_measured} origins "
          + ",".join(t.origin for t in result.trials))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
