"""A search space: named dimensions, each a tuple of choices, and the configurations they span.

Dimensions that are cuts of one plan (``cut1``, ``cut2``, ...) are *ordered*: a plan is the same
whichever order its cuts were suggested in, so a configuration sorts them, and a sampler that
proposes (9, 3) gets the plan (3, 9). A :class:`LookupTable` replays a space whose every
configuration has known objectives (a finished sweep, or the cost model over a space too large
to measure), so that samplers can be compared on it."""

from __future__ import annotations

import dataclasses
import itertools
import math
from typing import Any, Iterator, Mapping, Sequence

import pandas as pd

from ..errors import UsageError

Config = tuple  # one value per dimension, in the space's order


@dataclasses.dataclass(frozen=True)
class Dimension:
    """One axis of the space. ``ordered``: its choices have an order a sampler may exploit (cut
    positions, batch sizes), so it is suggested as an index; otherwise as a category."""

    name: str
    choices: tuple
    ordered: bool = False

    def __post_init__(self) -> None:
        if not self.choices:
            raise UsageError(f"search space: {self.name} has no choices")
        if len(set(self.choices)) != len(self.choices):
            raise UsageError(f"search space: {self.name} repeats a choice: {list(self.choices)}")


@dataclasses.dataclass(frozen=True)
class Space:
    """Dimensions, and which of them are the cuts of one plan (sorted into a plan)."""

    dims: tuple[Dimension, ...]
    plan: tuple[str, ...] = ()  # names of the dimensions that are one plan's cuts, in order
    # A dimension whose choice says how many of the plan's cuts a configuration uses (a search over
    # placements of several numbers of hosts: ``plan_lengths`` pairs each placement with its cuts).
    length_dim: str | None = None
    plan_lengths: tuple[tuple[Any, int], ...] = ()
    # A plan's cuts must differ: every stage of the chain runs a block at least (a language
    # model's chain); elsewhere cuts may coincide (a stage that runs nothing forwards).
    distinct: bool = False

    def __post_init__(self) -> None:
        names = [d.name for d in self.dims]
        if len(set(names)) != len(names):
            raise UsageError(f"search space: a dimension is named twice: {names}")
        unknown = [p for p in self.plan if p not in names]
        if unknown:
            raise UsageError(f"search space: plan dimensions {unknown} are not dimensions ({names})")
        choices = {self.dim(p).choices for p in self.plan}
        if len(choices) > 1:
            raise UsageError("search space: a plan's cut dimensions must offer the same positions")
        lengths = dict(self.plan_lengths)
        if self.length_dim is not None and (self.length_dim not in names or any(
                not 1 <= lengths.get(v, 0) <= len(self.plan) for v in self.dim(self.length_dim).choices)):
            raise UsageError(f"search space: {self.length_dim} must give each of its choices 1 to {len(self.plan)} cuts")

    @property
    def names(self) -> list[str]:
        return [d.name for d in self.dims]

    def dim(self, name: str) -> Dimension:
        return next(d for d in self.dims if d.name == name)

    def normalise(self, values: Mapping[str, Any]) -> Config:
        """The configuration of a suggestion: the plan's cuts sorted, the rest as given. Where the
        ``length_dim`` gives the plan fewer cuts, its first ones (in dimension order) are the plan
        and the others are set to the last position, so suggestions that differ only in unused
        cuts are one configuration."""
        config = {d.name: values[d.name] for d in self.dims}
        if self.plan:
            order = self.dim(self.plan[0]).choices
            used = self.cuts_used(config)
            cuts = sorted((config[p] for p in self.plan[:used]), key=order.index)
            config.update(zip(self.plan, cuts + [order[-1]] * (len(self.plan) - used)))
        return tuple(config[n] for n in self.names)

    def cuts_used(self, values: Mapping[str, Any]) -> int:
        """How many of the plan's cuts a configuration (as a dict) uses."""
        if self.length_dim is None:
            return len(self.plan)
        return dict(self.plan_lengths)[values[self.length_dim]]

    def valid(self, config: Config) -> bool:
        """Whether a configuration is one the space holds: with ``distinct``, its plan's cuts differ."""
        cuts = self.plan_of(config)
        return not self.distinct or len(set(cuts)) == len(cuts)

    def plan_of(self, config: Config) -> tuple:
        """A configuration's plan: the cuts it uses, in order."""
        values = self.as_dict(config)
        return tuple(values[p] for p in self.plan[:self.cuts_used(values)])

    def configs(self) -> Iterator[Config]:
        """Every distinct configuration (plans counted once: cuts in order)."""
        seen: set[Config] = set()
        for combo in itertools.product(*(d.choices for d in self.dims)):
            config = self.normalise(dict(zip(self.names, combo)))
            if config not in seen and self.valid(config):
                seen.add(config)
                yield config

    def size(self) -> int:
        """How many distinct configurations the space holds."""
        plan = len(self.plan)
        rest = math.prod(len(d.choices) for d in self.dims if d.name not in self.plan and d.name != self.length_dim)
        if not plan:
            return rest * (len(self.dim(self.length_dim).choices) if self.length_dim else 1)
        positions = len(self.dim(self.plan[0]).choices)
        lengths = [self.cuts_used({self.length_dim: v}) for v in self.dim(self.length_dim).choices] \
            if self.length_dim else [plan]
        if self.distinct:
            return sum(math.comb(positions, n) for n in lengths) * rest
        return sum(math.comb(positions + n - 1, n) for n in lengths) * rest  # multisets: cuts may coincide

    def as_dict(self, config: Config) -> dict[str, Any]:
        return dict(zip(self.names, config))


@dataclasses.dataclass
class LookupTable:
    """A space whose every configuration's objectives are known: ``table`` holds one row per
    configuration, with a column per dimension and per objective (``objectives``: name ->
    ``min`` or ``max``)."""

    space: Space
    table: pd.DataFrame
    objectives: dict[str, str]

    def __post_init__(self) -> None:
        missing = [c for c in [*self.space.names, *self.objectives] if c not in self.table.columns]
        if missing:
            raise UsageError(f"lookup table: no column {missing[0]!r} (columns: {', '.join(self.table.columns)})")
        self._values = {tuple(row[n] for n in self.space.names): tuple(float(row[o]) for o in self.objectives)
                        for _, row in self.table.iterrows()}

    def __len__(self) -> int:
        return len(self._values)

    def values(self, config: Config) -> tuple[float, ...] | None:
        """The objectives of ``config``; None where the table has no row (an infeasible one)."""
        return self._values.get(tuple(config))

    def all_values(self) -> list[tuple[float, ...]]:
        return list(self._values.values())


def from_table(table: pd.DataFrame, dims: Sequence[str], objectives: Mapping[str, str],
               ordered: Sequence[str] = (), plan: Sequence[str] = ()) -> LookupTable:
    """A lookup table over the distinct values of ``dims`` in ``table`` (a summary.csv, or a
    modelled space): each configuration's objectives are its row's (the median of its rows)."""
    missing = [c for c in [*dims, *objectives] if c not in table.columns]
    if missing:
        raise UsageError(f"lookup table: no column {missing[0]!r} (columns: {', '.join(table.columns)})")
    grouped = table.groupby(list(dims), as_index=False)[list(objectives)].median()
    positions = {v for p in plan for v in grouped[p].unique()}  # every cut dimension offers them all

    def choices(d: str) -> tuple:
        return tuple(_plain(v) for v in sorted(positions if d in plan else grouped[d].unique(), key=_sort_key))

    space = Space(tuple(Dimension(d, choices(d), d in ordered or d in plan) for d in dims), tuple(plan))
    for d in dims:
        grouped[d] = grouped[d].map(_plain)
    return LookupTable(space, grouped, dict(objectives))


def _plain(value: Any) -> Any:
    """A numpy scalar as the Python value it holds (choices go into Optuna's distributions)."""
    return value.item() if hasattr(value, "item") else value


def _sort_key(value: Any) -> tuple:
    value = _plain(value)
    return (0, value, "") if isinstance(value, (int, float)) else (1, 0, str(value))
