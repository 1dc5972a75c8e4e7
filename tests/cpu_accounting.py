"""Each test's CPU time, its processes' included (``PARETOPIPE_TEST_CPU=DIR``; ``make test-cpu``).

The parallel pass keeps both cores busy, so a test's wall time there says more about its
neighbours than about itself, and the pass lasts about the suite's CPU time over the cores. Each
pytest process moves itself into a cgroup of its own (cgroup v1's ``cpuacct``, or v2), which
every process it starts inherits: stage workers, sshd in a lab's namespace and the sessions it
forks, notebook kernels, postgres. A test's CPU is the group's usage across its call, set-up and
tear-down; rows go to ``DIR/<worker>.csv`` as ``cpu_s,wall_s,nodeid``, and
``python tests/cpu_accounting.py DIR`` prints the total and the tests that took most.

A test that moves a process into another cgroup of the same hierarchy (``--stage-cpu`` uses the
``cpu`` controller; on cgroup v2 that is this hierarchy) takes that process's CPU out of the count:
the figures are a floor for those tests.
"""

from __future__ import annotations

import atexit
import os
import sys
import time
from pathlib import Path

import pytest

ENV = "PARETOPIPE_TEST_CPU"
V1 = Path("/sys/fs/cgroup/cpuacct")
V2 = Path("/sys/fs/cgroup")
_group: Path | None = None
# Resolved once, at import: a test that changes the working directory must not move the rows.
_OUT = Path(os.environ.get(ENV, ".test-cpu")).resolve()


def _usage_s(group: Path) -> float:
    if (group / "cpuacct.usage").is_file():
        return int((group / "cpuacct.usage").read_text()) / 1e9
    stat = dict(line.split() for line in (group / "cpu.stat").read_text().splitlines())
    return int(stat["usage_usec"]) / 1e6


def _own_group(name: str) -> Path:
    """A new cgroup holding this process (and so everything it starts); OSError where none can be made."""
    root = V1 if (V1 / "cpuacct.usage").is_file() else V2
    if not (root / "cgroup.procs").is_file():
        raise OSError(f"no cgroup hierarchy at {root}")
    for stale in root.glob("paretopipe-test-cpu-*"):  # an earlier run's, left once its last process ended
        # Not another worker's: it may have made its group and not yet moved in (an empty group,
        # which the kernel would let us remove under it).
        owner = stale.name.rsplit("-", 1)[-1]
        if owner.isdigit() and Path(f"/proc/{owner}").exists():
            continue
        try:
            stale.rmdir()
        except OSError:
            pass  # a group with a process in it is another run's, still going: the kernel refuses
    group = root / f"paretopipe-test-cpu-{name}-{os.getpid()}"
    for attempt in (1, 2):  # another worker's sweep above may take the group between its mkdir and our move
        group.mkdir(exist_ok=True)
        try:
            (group / "cgroup.procs").write_text(str(os.getpid()))
            break
        except FileNotFoundError:
            if attempt == 2:
                raise
    atexit.register(_leave, group)  # after what this process started and stops at its exit (a zygote)
    return group


def _leave(group: Path) -> None:
    """Back to the root group, and the group removed; where a process it started still runs in
    it, the group stays until the next run's first test removes it."""
    try:
        (group.parent / "cgroup.procs").write_text(str(os.getpid()))
        group.rmdir()
    except OSError:
        pass


_tried = False


def _group_for_tests() -> Path | None:
    """This process's group, made at its first test (an xdist controller, which runs none, makes none)."""
    global _group, _tried
    if not _tried and os.environ.get(ENV):
        _tried = True
        try:
            _group = _own_group(os.environ.get("PYTEST_XDIST_WORKER", "main"))
        except OSError as exc:
            print(f"{ENV}: cannot account CPU per test here ({exc}); running without it", file=sys.stderr)
    return _group


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None):
    if _group_for_tests() is None:
        yield
        return
    cpu0, wall0 = _usage_s(_group), time.monotonic()
    yield
    cpu, wall = _usage_s(_group) - cpu0, time.monotonic() - wall0
    out = _OUT
    out.mkdir(parents=True, exist_ok=True)
    with open(out / f"{os.environ.get('PYTEST_XDIST_WORKER', 'main')}.csv", "a") as fh:
        fh.write(f"{cpu:.2f},{wall:.2f},{item.nodeid}\n")


def summary(folder: Path, top: int = 25) -> str:
    """The pass's total CPU and its ``top`` tests by CPU, from the rows under ``folder``."""
    rows = []
    for path in sorted(folder.glob("*.csv")):
        for line in path.read_text().splitlines():
            cpu, wall, nodeid = line.split(",", 2)
            rows.append((float(cpu), float(wall), nodeid))
    rows.sort(reverse=True)
    total = sum(r[0] for r in rows)
    lines = [f"{len(rows)} tests, {total:.0f} s of CPU in all ({total / 60:.1f} min; over two cores "
             f"about {total / 120:.1f} min)", f"the {top} that took most CPU (cpu s, wall s):"]
    lines += [f"{cpu:8.1f} {wall:8.1f}  {nodeid}" for cpu, wall, nodeid in rows[:top]]
    return "\n".join(lines)


if __name__ == "__main__":
    print(summary(Path(sys.argv[1])))
