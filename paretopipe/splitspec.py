"""A split as one typed value: a block index k, an N-stage plan (k1, k2, ...), a fine cut named
by its live set (``maxpool+layer1_0_relu``), or a policy that chooses per batch: ``adaptive``
(ours) or ``sciot`` (SCIoT's decision rule).

Every form a split takes elsewhere comes from here: its label in runs.csv (``split_index``: ``3``,
``3,9``, the cut's name or ``adaptive``), its part of a configuration key (``k03``, ``k3-9``,
``cmaxpool.layer1_0_relu``, ``kadaptive``), the value a run's configuration records, its number of
stages, and the order tables list splits in (block splits, then cuts, then plans, then adaptive).
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any, Iterable

from .errors import UsageError

ADAPTIVE = "adaptive"
SCIOT = "sciot"
#: The splits a runtime policy chooses per batch, by name (controller/adaptive_setup.py builds each).
POLICIES = (ADAPTIVE, SCIOT)
#: A fine cut's name: fx node names joined by ``+`` (the tensors that cross it).
CUT_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\+[A-Za-z_][A-Za-z0-9_]*)*")


def is_cut_name(text: str) -> bool:
    return bool(CUT_NAME.fullmatch(text)) and text.lower() not in POLICIES


@dataclasses.dataclass(frozen=True)
class Split:
    """``blocks``: the block index of each cut, in order (one for a two-stage split; empty for
    adaptive, whose split the runtime chooses per batch, by ``policy``: adaptive or sciot).
    ``plan``: written as a plan of stages (``--split-blocks``, a list in a record), which keeps its
    plan form even with one cut."""

    blocks: tuple[int, ...] = ()
    adaptive: bool = False
    plan: bool = False
    cut: str = ""  # a fine cut (a live set), for the cuts --max-live adds to a sweep
    policy: str = ""  # the runtime policy of an adaptive split: adaptive (the default) or sciot

    def __post_init__(self) -> None:
        if self.adaptive and not self.policy:
            object.__setattr__(self, "policy", ADAPTIVE)
        if self.policy and (not self.adaptive or self.policy not in POLICIES):
            raise UsageError(f"split policy {self.policy!r}: valid {', '.join(POLICIES)}")
        if self.adaptive + bool(self.blocks) + bool(self.cut) != 1:
            raise UsageError("a split is block indices, a cut or adaptive: exactly one of them")
        if self.cut and not is_cut_name(self.cut):
            raise UsageError(f"split {self.cut!r}: a cut is named by its tensors joined with + (paretopipe split "
                             f"--list --fine)")
        if len(self.blocks) > 1 and not self.plan:
            object.__setattr__(self, "plan", True)  # several cuts are always a plan
        if any(isinstance(k, bool) or not isinstance(k, int) or k < 0 for k in self.blocks):
            raise UsageError(f"split {self.blocks!r}: block indices are whole numbers from 0")
        if list(self.blocks) != sorted(self.blocks):
            raise UsageError(f"split {','.join(map(str, self.blocks))}: a plan's splits go in increasing order")

    @classmethod
    def of(cls, value: Any) -> "Split":
        """A split from any form it is written in: a Split, k, a list or tuple of k, ``"k"``,
        ``"k1,k2"`` (a label), or ``"adaptive"``."""
        if isinstance(value, Split):
            return value
        if isinstance(value, str):
            text = value.strip()
            if text.lower() in POLICIES:
                return cls(adaptive=True, policy=text.lower())
            if is_cut_name(text):
                return cls(cut=text)
            try:
                value = [int(p) for p in text.split(",")]
            except ValueError:
                raise UsageError(f"split {value!r}: a block index k, a plan k1,k2,..., a cut name, {ADAPTIVE} or {SCIOT}")
            if len(value) == 1:
                return cls((value[0],))
        if isinstance(value, (list, tuple)):
            return cls(tuple(int(k) if hasattr(k, "__index__") and not isinstance(k, bool) else k for k in value),
                       plan=True)
        if hasattr(value, "__index__") and not isinstance(value, bool):  # int, numpy integers
            return cls((int(value),))
        raise UsageError(f"split {value!r}: a block index k, a plan k1,k2,..., a cut name, {ADAPTIVE} or {SCIOT}")

    @property
    def stages(self) -> int:
        return len(self.blocks) + 1 if self.blocks else 2

    @property
    def label(self) -> int | str:
        """runs.csv's ``split_index``: k, ``k1,k2``, the cut's name, or the policy's name."""
        if self.adaptive:
            return self.policy
        if self.cut:
            return self.cut
        return ",".join(map(str, self.blocks)) if self.plan else self.blocks[0]

    @property
    def key(self) -> str:
        """The split's part of a configuration key: ``k03``, ``k3-9``, ``c<cut>``, ``kadaptive`` or ``ksciot``."""
        if self.adaptive:
            return f"k{self.policy}"
        if self.cut:  # "." where the name has "+": file names keep it, and node names never hold one
            return "c" + self.cut.replace("+", ".")
        return "k" + "-".join(map(str, self.blocks)) if self.plan else f"k{self.blocks[0]:02d}"

    @property
    def config(self) -> int | list[int] | str:
        """What a run's configuration records as ``split_index``."""
        if self.adaptive:
            return self.policy
        if self.cut:
            return self.cut
        return list(self.blocks) if self.plan else self.blocks[0]

    def sort_key(self) -> tuple:
        """Block splits in numeric order, then cuts (by name: a split knows no graph), then N-stage
        plans, then the policies."""
        if self.adaptive:
            return (2, POLICIES.index(self.policy), self.policy)
        if self.cut:
            return (0.5, 0, self.cut)
        return (1, len(self.blocks), self.blocks) if self.plan else (0, self.blocks[0], "")

    def __str__(self) -> str:
        return str(self.label)


def sort_key(value: Any) -> tuple:
    """A table's order for any written split; what is no split (an empty cell) comes last."""
    try:
        return Split.of(value).sort_key()
    except (UsageError, ValueError, TypeError, OverflowError):
        return (3, 0, str(value))


def check_splits(ks: Iterable[Any], num_blocks: int, model: str | None = None, what: str = "split index") -> None:
    """The one range rule for block splits: k in 0..K, where 0 puts the whole model on stage 2 and K
    all of it on stage 1. Raises with the first bad one, in one line that names what is valid."""
    bad = [k for k in ks if isinstance(k, bool) or not isinstance(k, int) or not 0 <= k <= num_blocks]
    if bad:
        where = f" for {model}" if model else ""
        raise UsageError(f"{what} {bad[0]} out of range{where}: valid 0..{num_blocks} (0 = all on stage 2, "
                         f"{num_blocks} = all on stage 1, 1..{num_blocks - 1} = block cuts)")


# -- the split texts of --splits and --split-blocks ---------------------------------------------
def split_adaptive(text: str) -> tuple[str, list[str]]:
    """``--splits`` without its policy members (``adaptive``, ``sciot``), and those it named, in order."""
    parts = [p.strip() for p in text.split(",")]
    kept = [p for p in parts if p.lower() not in POLICIES]
    return ",".join(kept), list(dict.fromkeys(p.lower() for p in parts if p.lower() in POLICIES))


def split_cuts(text: str) -> tuple[str, list[str]]:
    """``--splits`` without the fine cuts it names, and those names in order."""
    parts = [p.strip() for p in text.split(",")]
    named = [p for p in parts if p.lower() != "all" and is_cut_name(p)]
    return ",".join(p for p in parts if p not in named), named  # an empty member stays, for parse_splits to refuse


def parse_splits(text: str, num_blocks: int) -> list[int]:
    """``all``, ``1,4,8``, ``2-10`` or a mix, each within 0..K (0 and K are the baselines)."""
    if text.strip().lower() == "all":
        return list(range(num_blocks + 1))
    out: list[int] = []
    for part in text.split(","):
        part = part.strip()
        try:
            if "-" in part:
                lo, hi = (int(x) for x in part.split("-", 1))
                if lo > hi:
                    raise UsageError(f"bad --splits range {part!r}: write it low-high, e.g. 2-10")
                out.extend(range(lo, hi + 1))
            elif part:
                out.append(int(part))
        except ValueError:
            raise UsageError(f"bad --splits {text!r}: use all, a list like 1,4,8 or a range like 2-10")
    check_splits(out, num_blocks)
    if not out:
        raise UsageError(f"--splits {text!r} names no split: use all, a list like 1,4,8 or a range like 2-10")
    return sorted(set(out))


def parse_plans(text: str, mixed: bool = False) -> list[tuple[int, ...]]:
    """``3,9;5,12``: N-stage plans as ``--split-blocks`` lists (the planner prints them so);
    ``mixed``: plans may have different numbers of stages (a sweep over --placements)."""
    plans = []
    for part in text.split(";"):
        part = part.strip()
        if not part:
            continue
        try:
            ks = tuple(int(k) for k in part.split(","))
        except ValueError:
            raise UsageError(f"bad --split-blocks {text!r}: plans are comma lists of block indices separated by "
                             f"';', e.g. 3,9;5,12")
        if list(ks) != sorted(ks) or min(ks) < 0:
            raise UsageError(f"--split-blocks plan {part!r}: block indices must be increasing and at least 0")
        plans.append(ks)
    if not plans:
        raise UsageError(f"--split-blocks {text!r} names no plan")
    if not mixed and len({len(p) for p in plans}) != 1:
        raise UsageError(f"--split-blocks {text!r}: every plan needs the same number of stages")
    return plans
