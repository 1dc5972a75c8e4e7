"""CPU quota for one process through a cgroup (v1 ``cpu`` controller or v2 ``cpu.max``).

Used to make a stage on this machine behave like a weaker device: a share of 0.25 lets the
process run for a quarter of every scheduling period. The period is 10 ms, not the kernel's
default 100 ms: with 100 ms a 25 ms batch often runs at full speed and then a later one is
frozen for 50 ms, so per-batch times split in two. Shorter periods cost more than the share
says (measured on this 2-vCPU VM, MobileNetV2 batch 1: share 0.5 gave 3.4x at a 2 ms period,
2.2x at 10 ms, 2.2x at 20 ms), so 10 ms is the compromise. The slowdown is what the stage
experiences, and a profile taken under the same share (``paretopipe.profile --cpu-share``)
measures it the same way.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import threading
from pathlib import Path
from typing import Any, Iterator

from ..errors import UsageError

V1_ROOT = Path("/sys/fs/cgroup/cpu")
V2_ROOT = Path("/sys/fs/cgroup")
GROUP_PREFIX = "paretopipe-"
MIN_QUOTA_US = 1000       # the kernel refuses quotas below 1 ms
MAX_PERIOD_US = 1_000_000
PERIOD_US = 10_000


def parse_shares(text: str | None, stages: int, flag: str = "--stage-cpu", each: str = "stage") -> list[float | None]:
    """``0.25,1`` -> one share per stage (or per ``each`` of ``flag``'s; ``none`` or empty for no limit)."""
    if not text:
        return [None] * stages
    parts = [p.strip() for p in text.split(",")]
    if len(parts) != stages:
        raise UsageError(f"{flag} {text!r}: give one share per {each} ({stages}), e.g. 0.25,1")
    out: list[float | None] = []
    for part in parts:
        if part.lower() in ("", "none", "-"):
            out.append(None)
            continue
        try:
            share = float(part)
        except ValueError:
            raise UsageError(f"{flag} {text!r}: {part!r} is not a number (a CPU share such as 0.25)")
        check_share(share)
        out.append(share)
    return out


def check_share(share: float) -> None:
    cores = os.cpu_count() or 1
    if not (MIN_QUOTA_US / MAX_PERIOD_US <= share <= cores) or math.isnan(share):
        raise UsageError(f"CPU share {share:g} out of range: valid {MIN_QUOTA_US / MAX_PERIOD_US:g}..{cores} "
                         f"(1 = one full core)")


def threads_within(share: float | None, threads: int) -> int:
    """``threads`` no more than ``share`` rounds up to: threads beyond a process's quota only wait
    on each other's throttled periods (on a 16-core machine, eight torch threads held to 0.35 of a
    core made MobileNetV2 take 28 s a batch, not 37 ms)."""
    return threads if share is None else max(1, min(threads, math.ceil(share)))


def quota_period_us(share: float) -> tuple[int, int]:
    """(quota, period) in microseconds for ``share`` of one core: a 10 ms period, longer where the
    quota would fall below the kernel's 1 ms minimum."""
    check_share(share)
    quota = round(share * PERIOD_US)
    if quota >= MIN_QUOTA_US:
        return quota, PERIOD_US
    return MIN_QUOTA_US, min(MAX_PERIOD_US, round(MIN_QUOTA_US / share))


@dataclasses.dataclass(frozen=True)
class Hierarchy:
    """Where the cpu controller lives: cgroup v1 (``cpu.cfs_*``) or v2 (``cpu.max``)."""

    version: int
    root: Path

    @classmethod
    def detect(cls, v1_root: Path = V1_ROOT, v2_root: Path = V2_ROOT) -> "Hierarchy":
        if (v1_root / "cpu.cfs_quota_us").exists():
            return cls(1, v1_root)
        controllers = v2_root / "cgroup.controllers"
        if controllers.exists() and "cpu" in controllers.read_text().split():
            return cls(2, v2_root)
        raise UsageError("CPU shares need a cgroup cpu controller (v1 /sys/fs/cgroup/cpu or v2 with cpu in "
                         "cgroup.controllers) and none was found; drop --stage-cpu/--cpu-share or run where "
                         "cgroups are mounted")


def _write(path: Path, value: str) -> None:
    try:
        path.write_text(value)
    except OSError as exc:
        raise UsageError(f"cannot write {value.strip()!r} to {path}: {exc.strerror or exc} "
                         f"(CPU shares need root or a delegated cgroup)")


def _make_group(h: Hierarchy, share: float, name: str, pid: int) -> dict[str, Any]:
    quota, period = quota_period_us(share)
    group = h.root / f"{GROUP_PREFIX}{name}-{pid}"
    try:
        group.mkdir(exist_ok=True)
    except OSError as exc:
        raise UsageError(f"cannot create cgroup {group}: {exc.strerror or exc} (CPU shares need root)")
    if h.version == 1:
        _write(group / "cpu.cfs_period_us", str(period))
        _write(group / "cpu.cfs_quota_us", str(quota))
    else:
        with contextlib.suppress(OSError):  # enabling may already be done, or be the parent's job
            (h.root / "cgroup.subtree_control").write_text("+cpu")
        _write(group / "cpu.max", f"{quota} {period}")
    return {"cpu_share": share, "cgroup": str(group), "cgroup_version": h.version,
            "cpu_quota_us": quota, "cpu_period_us": period}


def set_share(applied: dict[str, Any], share: float, hierarchy: Hierarchy | None = None) -> None:
    """Change the share of a group made by :func:`limit` or :func:`limit_compute` (a compute
    trace's step): its processes keep running, at the new quota from the next period."""
    h = hierarchy or Hierarchy.detect()
    quota, period = quota_period_us(share)
    group = Path(applied["cgroup"])
    if h.version == 1:
        _write(group / "cpu.cfs_period_us", str(period))
        _write(group / "cpu.cfs_quota_us", str(quota))
    else:
        _write(group / "cpu.max", f"{quota} {period}")


def limit(pid: int, share: float, name: str, hierarchy: Hierarchy | None = None) -> dict[str, Any]:
    """Move ``pid`` (all its threads) into a new cgroup limited to ``share`` of one core.

    Returns what was applied, for the run manifest. Undo with :func:`release`.
    """
    h = hierarchy or Hierarchy.detect()
    applied = _make_group(h, share, name, pid)
    _write(Path(applied["cgroup"]) / "cgroup.procs", str(pid))
    applied["scope"] = "process"
    return applied


_compute_group: dict[str, Any] | None = None


def limit_compute(pid: int, share: float, name: str, hierarchy: Hierarchy | None = None) -> dict[str, Any]:
    """A group for this process's compute threads only (they join with :func:`join_compute_thread`).

    A slower device computes slower, but its network threads are not frozen for the rest of a
    quota period whenever the compute has used its share; holding only the compute threads keeps
    that artefact of the emulation off the link. cgroup v2 cannot hold single threads of a
    process in a domain group, so there the whole process is limited.
    """
    global _compute_group
    h = hierarchy or Hierarchy.detect()
    if h.version != 1:
        return limit(pid, share, name, h)
    applied = _make_group(h, share, name, pid)
    applied["scope"] = "compute threads"
    _compute_group = applied
    return applied


def join_compute_thread() -> None:
    """Called by a thread about to run stage compute; a no-op unless :func:`limit_compute` ran."""
    group = _compute_group
    if group is not None:
        _write(Path(group["cgroup"]) / "tasks", str(threading.get_native_id()))


def release(applied: dict[str, Any], pid: int) -> None:
    """Move what is in the group back to the root group and remove the group (best effort: the
    processes may be gone)."""
    global _compute_group
    group = Path(applied["cgroup"])
    if _compute_group is applied:
        _compute_group = None
    members = "tasks" if applied.get("scope") == "compute threads" else "cgroup.procs"
    try:
        ids = (group / members).read_text().split()
    except OSError:
        ids = []
    for member in ids or [str(pid)]:
        with contextlib.suppress(OSError):
            (group.parent / members).write_text(member)
    with contextlib.suppress(OSError):
        group.rmdir()


def remove_group(group: str | Path) -> None:
    """Move whatever a process group made by :func:`limit` still holds back to its parent, and
    remove it (best effort: it may be gone)."""
    group = Path(group)
    with contextlib.suppress(OSError):
        for member in (group / "cgroup.procs").read_text().split():
            with contextlib.suppress(OSError):
                (group.parent / "cgroup.procs").write_text(member)
    with contextlib.suppress(OSError):
        group.rmdir()


def check_writable(hierarchy: Hierarchy | None = None) -> None:
    """Refuse in one line where the cpu controller cannot be written (not root, a read-only
    cgroup mount): make and remove a group of our own."""
    h = hierarchy or Hierarchy.detect()
    group = h.root / f"{GROUP_PREFIX}check-{os.getpid()}"
    try:
        group.mkdir(exist_ok=True)
        group.rmdir()
    except OSError as exc:
        raise UsageError(f"the cgroup cpu controller at {h.root} cannot be written ({exc.strerror or exc}): CPU "
                         f"shares and compute traces need root or a delegated cgroup")


def remove_stale(hierarchy: Hierarchy | None = None) -> int:
    """Remove our empty groups left by processes that were killed; returns how many went."""
    try:
        h = hierarchy or Hierarchy.detect()
    except UsageError:
        return 0
    removed = 0
    for group in h.root.glob(f"{GROUP_PREFIX}*"):
        pid = group.name.rsplit("-", 1)[-1]
        if pid.isdigit() and Path(f"/proc/{pid}").exists():
            continue
        with contextlib.suppress(OSError):
            group.rmdir()
            removed += 1
    return removed


@contextlib.contextmanager
def limited(share: float | None, name: str, pid: int | None = None) -> Iterator[dict[str, Any]]:
    """Run the body with this process (or ``pid``) held to ``share``; no-op for ``None``."""
    if share is None:
        yield {"cpu_share": None}
        return
    pid = os.getpid() if pid is None else pid
    applied = limit(pid, share, name)
    try:
        yield applied
    finally:
        release(applied, pid)
