"""Peak memory of this process, per run: the kernel's high-water mark of its resident set (VmHWM),
reset between runs through ``/proc/self/clear_refs``, and memory limits as users write them.

``clear_refs`` with 5 resets the high-water mark to the current RSS (Linux 4.0 and later), so a
stage that lives for a whole sweep reports each run's own peak, not the largest of all runs. Where
it cannot be reset (another kernel, no /proc), the figure is the process's peak so far, and the
record says so.
"""

from __future__ import annotations

import re
from pathlib import Path

from ..errors import UsageError

_UNITS = {"b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
          "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40, "k": 2**10, "m": 2**20, "g": 2**30}
_SIZE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*([A-Za-z]*)\s*$")


def reset_peak_rss(proc: Path = Path("/proc/self")) -> bool:
    """Reset this process's peak RSS to its current RSS; False where the kernel does not allow it."""
    try:
        (proc / "clear_refs").write_text("5")
        return True
    except OSError:
        return False


def peak_rss_bytes(proc: Path = Path("/proc/self")) -> int | None:
    """VmHWM of ``/proc/self/status`` in bytes (None where there is no /proc)."""
    try:
        for line in (proc / "status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def parse_size(text: str, what: str = "--memory-limit") -> int:
    """``1GiB``, ``512MiB``, ``2GB``, ``3e9`` bytes: a size in bytes."""
    m = _SIZE.match(str(text))
    unit = (m.group(2) if m else "").lower()
    if not m or unit not in _UNITS and unit != "":
        raise UsageError(f"{what} {text!r}: give a size such as 1GiB, 512MiB or 2GB")
    value = float(m.group(1)) * _UNITS.get(unit, 1)
    if value <= 0:
        raise UsageError(f"{what} {text!r}: must be positive")
    return int(value)


def parse_limits(text: str | None, stages: int) -> dict[str, int]:
    """``--memory-limit stage1=1GiB`` (or ``1GiB,8GiB``, one per stage): bytes per stage name."""
    if not text:
        return {}
    parts = [p.strip() for p in text.split(",") if p.strip()]
    out: dict[str, int] = {}
    if all("=" not in p for p in parts):
        if len(parts) != stages:
            raise UsageError(f"--memory-limit {text!r}: give one size per stage ({stages}), or stageN=SIZE")
        return {f"stage{j}": parse_size(p) for j, p in enumerate(parts, start=1)}
    for part in parts:
        name, _, size = part.partition("=")
        name = name.strip()
        if not re.fullmatch(r"stage[1-9][0-9]?", name) or int(name[5:]) > stages:
            raise UsageError(f"--memory-limit {part!r}: name a stage (stage1..stage{stages}) before '='")
        out[name] = parse_size(size)
    return out
