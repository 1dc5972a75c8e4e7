"""Pareto fronts, bootstrap robustness, hypervolume and knee points.

Objectives are columns with a sense (``min`` or ``max``). A row is on the front when no other row
is at least as good on every objective and strictly better on one, so weakly dominated rows are
excluded and exact duplicates are all kept. Failed/incomplete rows and rows with NaN objectives
never take part; how many were left out is reported in ``df.attrs``.

Measured fronts are compared by their epsilon-fronts (:func:`front_status`): on a network where
every split lies within a few percent of the others, the strict front is a crowd of near-ties whose
membership flips with noise, so a point counts as dominated only when another beats it by more than
the measurement's own 95% intervals on one objective and is no worse, beyond them, on any.
"""

from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np
import pandas as pd
from paretoset import paretorank, paretoset

DEFAULT_OBJECTIVES = {"latency_s": "min", "throughput_imgs_per_s": "max"}
DEFAULT_GROUP = ("model", "backend", "network", "batch_size")
#: Reference point of the hypervolume in normalised minimisation space (0 = best seen, 1 = worst seen).
HV_REFERENCE = (1.1, 1.1)


def _usable(df: pd.DataFrame, objectives: Mapping[str, str]) -> tuple[pd.DataFrame, int, int]:
    failed = 0
    if "status" in df.columns:
        ok = df["status"].fillna("complete").eq("complete")
        failed = int((~ok).sum())
        df = df[ok]
    cols = list(objectives)
    # runs.csv of a session written before a figure existed lacks its column: none of its runs has it
    df = df.assign(**{c: np.nan for c in cols if c not in df.columns})
    nan = df[cols].isna().any(axis=1)
    return df[~nan], failed, int(nan.sum())


def front_mask(values: np.ndarray, senses: Sequence[str]) -> np.ndarray:
    """Boolean mask of the non-dominated rows of ``values`` (n x m)."""
    if len(values) == 0:
        return np.zeros(0, dtype=bool)
    # numba's path compiles itself anew in every process (7 s here, more than the whole report);
    # numpy's is instant for the few hundred points of a sweep.
    return np.asarray(paretoset(np.asarray(values, dtype=float), sense=list(senses), distinct=False,
                                use_numba=False), dtype=bool)


def ranks(values: np.ndarray, senses: Sequence[str]) -> np.ndarray:
    """Each row's layer of non-dominated sorting: 0 on the front, 1 on the front of what is left
    without it, and so on (paretoset's ``paretorank``, from 0)."""
    if len(values) == 0:
        return np.zeros(0, dtype=int)
    return np.asarray(paretorank(np.asarray(values, dtype=float), sense=list(senses), distinct=False,
                                 use_numba=False), dtype=int) - 1


def front(df: pd.DataFrame, objectives: Mapping[str, str] | None = None,
          by: Sequence[str] | None = None) -> pd.DataFrame:
    """Rows on the Pareto front of each group (default: model, backend, profile, batch size)."""
    objectives = dict(objectives or DEFAULT_OBJECTIVES)
    bad = [s for s in objectives.values() if s not in ("min", "max")]
    if bad:
        raise ValueError(f"objective sense {bad[0]!r}: use 'min' or 'max'")
    usable, failed, nan = _usable(df, objectives)
    groups = [c for c in (DEFAULT_GROUP if by is None else by) if c in usable.columns]
    parts = []
    for _, g in (usable.groupby(groups, dropna=False, sort=True) if groups else [((), usable)]):
        mask = front_mask(g[list(objectives)].to_numpy(dtype=float), list(objectives.values()))
        parts.append(g[mask])
    out = pd.concat(parts) if parts else usable.iloc[0:0]
    out.attrs = {"excluded_failed": failed, "excluded_nan": nan, "objectives": objectives, "by": groups}
    return out


def mark_front(df: pd.DataFrame, objectives: Mapping[str, str] | None = None,
               by: Sequence[str] | None = None) -> pd.DataFrame:
    """``df`` with an ``on_front`` column (False for excluded rows)."""
    on = front(df, objectives, by)
    out = df.copy()
    out["on_front"] = out.index.isin(on.index)
    out.attrs = on.attrs
    return out


FRONT, TIED, DOMINATED = "front", "tied", "dominated"


def interval_epsilon(frame: pd.DataFrame, intervals: Mapping[str, tuple[str, str]],
                     objectives: Mapping[str, str]) -> np.ndarray:
    """Per objective, how far apart two of this group's points must be before the measurement can
    tell them apart: the median relative half-width of its configurations' 95% intervals (0 where
    none was measured, so that the epsilon-front is then the strict front)."""
    out = []
    for col in objectives:
        lo_col, hi_col = intervals.get(col, ("", ""))
        if lo_col not in frame or hi_col not in frame or col not in frame:
            out.append(0.0)
            continue
        point = frame[col].to_numpy(dtype=float)
        with np.errstate(divide="ignore", invalid="ignore"):
            half = (frame[hi_col].to_numpy(dtype=float) - frame[lo_col].to_numpy(dtype=float)) / 2 / np.abs(point)
        half = half[np.isfinite(half) & (half >= 0)]
        out.append(float(np.median(half)) if len(half) else 0.0)
    return np.asarray(out)


def resampled_front_agreement(runs: pd.DataFrame, config_cols: Sequence[str], objectives: Mapping[str, str],
                              epsilon: Sequence[float], resamples: int = 100, seed: int = 0) -> float | None:
    """How well the sweep agrees with itself on one group's epsilon-front: the mean Jaccard between
    its front (of the runs' medians, with ``epsilon``, the noise of those medians) and the front of
    each bootstrap resample of every configuration's runs, as a second sweep of the same size would
    draw it. A single run's front is no stand-in: on a 2-core machine one run's latency swings by
    20%. None where no configuration has two runs."""
    usable, _, _ = _usable(runs, objectives)
    values = [g[list(objectives)].to_numpy(dtype=float) for _, g in usable.groupby(list(config_cols), dropna=False)]
    if not values or max(len(v) for v in values) < 2:
        return None
    rng = np.random.default_rng(seed)
    senses = list(objectives.values())

    def front_of(medians: np.ndarray) -> set[int]:
        return set(np.flatnonzero(epsilon_front_mask(medians, senses, epsilon)).tolist())

    full = front_of(np.array([np.median(v, axis=0) for v in values]))
    scores = []
    for _ in range(resamples):
        drawn = front_of(np.array([np.median(v[rng.integers(0, len(v), len(v))], axis=0) for v in values]))
        scores.append(len(full & drawn) / len(full | drawn) if full | drawn else 1.0)
    return float(np.mean(scores))


def reproduces(agreement: float | None, goal: float) -> bool:
    """Whether a front is judged: its sweep agrees with itself (:func:`resampled_front_agreement`)
    at least at ``goal``, or cannot say (no repeated runs: None or NaN)."""
    return agreement is None or agreement != agreement or agreement >= goal


def epsilon_front_mask(values: np.ndarray, senses: Sequence[str], epsilon: Sequence[float]) -> np.ndarray:
    """Rows that no other row dominates beyond the noise: a row is dominated only by one that is
    better by more than ``epsilon`` (relative, per objective) on one objective and no worse, beyond
    the same epsilon, on any. With epsilon 0 this is the strict front (duplicates kept). A difference
    within the noise counts neither way: a 0.3% edge in latency does not keep a split on the front
    beside one with twice its throughput. Such a relation is not transitive and can run in a circle
    (epsilon differs per objective); where that leaves no row, the strict front stands."""
    x = np.asarray(values, dtype=float) * np.array([1.0 if s == "min" else -1.0 for s in senses])
    if len(x) == 0:
        return np.zeros(0, dtype=bool)
    tolerance = np.asarray(epsilon, dtype=float) * np.abs(x)[None, :, :]           # [., j, m]: j's noise on m
    no_worse = (x[:, None, :] <= x[None, :, :] + tolerance).all(axis=2)            # [i, j]: i within j's noise
    better = (x[:, None, :] < x[None, :, :] - tolerance).any(axis=2)               # [i, j]: i beats j beyond it
    front = ~(no_worse & better).any(axis=0)
    return front if front.any() else front_mask(values, senses)


def front_status(df: pd.DataFrame, intervals: Mapping[str, tuple[str, str]],
                 objectives: Mapping[str, str] | None = None, by: Sequence[str] | None = None) -> pd.Series:
    """Each row against its group's epsilon-front (:func:`epsilon_front_mask` with the group's noise,
    :func:`interval_epsilon`): ``front`` (on it and on the strict front), ``tied`` (on it, though
    strictly dominated: nothing beats it beyond the noise) or ``dominated`` (beaten beyond the noise;
    a strict-front point too whose only edge is within the noise); ``dominated`` too for an
    infeasible configuration (it missed the user's deadline); empty for rows left out (failed, NaN).
    ``intervals`` maps each objective to its (low, high) CI columns; without them epsilon is 0 and
    the statuses are the strict front's."""
    objectives = dict(objectives or DEFAULT_OBJECTIVES)
    marked = mark_front(df, objectives, by)
    status = pd.Series("", index=df.index, dtype=object)
    if "status" in df.columns:
        status[df["status"].eq("infeasible")] = DOMINATED
    usable, _, _ = _usable(df, objectives)
    groups = [c for c in (DEFAULT_GROUP if by is None else by) if c in usable.columns]
    for _, g in (usable.groupby(groups, dropna=False, sort=False) if groups else [((), usable)]):
        on = marked.loc[g.index, "on_front"].to_numpy(dtype=bool)
        near = epsilon_front_mask(g[list(objectives)].to_numpy(dtype=float), list(objectives.values()),
                                  interval_epsilon(g, intervals, objectives))
        status.loc[g.index] = np.where(near & on, FRONT, np.where(near, TIED, DOMINATED))
    return status


def robustness(runs: pd.DataFrame, config_cols: Sequence[str], objectives: Mapping[str, str] | None = None,
               by: Sequence[str] | None = None, resamples: int = 200, seed: int = 0) -> pd.Series:
    """Share of bootstrap resamples of the runs in which each configuration stays on the front.

    Each resample draws every configuration's runs with replacement, takes per-configuration
    medians, and recomputes the fronts. Indexed by ``config_cols``.
    """
    objectives = dict(objectives or DEFAULT_OBJECTIVES)
    usable, _, _ = _usable(runs, objectives)
    grouped = [(key, g[list(objectives)].to_numpy(dtype=float)) for key, g in usable.groupby(list(config_cols))]
    keys = [k for k, _ in grouped]
    index = pd.MultiIndex.from_tuples(keys, names=list(config_cols)) if len(config_cols) > 1 else \
        pd.Index([k[0] if isinstance(k, tuple) else k for k in keys], name=config_cols[0])
    if not keys:  # no run measured anything: every configuration is off the front, none robust
        return pd.Series([], index=index, dtype=float, name="front_robustness")
    rng = np.random.default_rng(seed)
    # The front groups are fixed across resamples: find each configuration's group once, and leave
    # pandas out of the resampling loop (200 DataFrame fronts cost about 1 s per report).
    meta = pd.DataFrame(keys, columns=list(config_cols))
    groups = [c for c in (DEFAULT_GROUP if by is None else by) if c in meta.columns]
    members = [np.asarray(ix) for ix in meta.groupby(groups, dropna=False, sort=False).indices.values()] \
        if groups else [np.arange(len(keys))]
    senses = list(objectives.values())
    hits = np.zeros(len(keys))
    for _ in range(resamples):
        medians = np.array([np.median(v[rng.integers(0, len(v), len(v))], axis=0) for _, v in grouped])
        for ix in members:
            hits[ix] += front_mask(medians[ix], senses)
    return pd.Series(hits / resamples, index=index, name="front_robustness")


def normalise(points: np.ndarray, senses: Sequence[str], lower: np.ndarray, upper: np.ndarray) -> np.ndarray:
    """Map objectives to [0, 1] minimisation space: 0 = best bound, 1 = worst bound."""
    pts = np.asarray(points, dtype=float)
    span = np.where(upper > lower, upper - lower, 1.0)
    out = (pts - lower) / span
    for j, sense in enumerate(senses):
        if sense == "max":
            out[:, j] = 1.0 - out[:, j]
    return out


def hypervolume_2d(points: np.ndarray, reference: Sequence[float] = HV_REFERENCE) -> float:
    """Exact area dominated by ``points`` (minimisation, normalised) up to ``reference``."""
    pts = np.asarray(points, dtype=float)
    if pts.size == 0:
        return 0.0
    pts = pts[(pts[:, 0] < reference[0]) & (pts[:, 1] < reference[1])]
    if pts.size == 0:
        return 0.0
    pts = pts[np.lexsort((pts[:, 1], pts[:, 0]))]
    area, best_y = 0.0, reference[1]
    for x, y in pts:  # sweep left to right; each point adds the strip it improves
        if y < best_y:
            area += (reference[0] - x) * (best_y - y)
            best_y = y
    return float(area)


def hypervolume(points: np.ndarray, reference: Sequence[float] | None = None) -> float:
    """Exact volume dominated by ``points`` (minimisation, normalised; any number of objectives)
    up to ``reference`` (1.1 on every axis by default), by slicing along the last objective: a
    sweep's fronts hold tens of points, where the slices' O(n^(m-1)) is instant."""
    pts = np.asarray(points, dtype=float)
    if pts.size == 0:
        return 0.0
    m = pts.shape[1]
    ref = np.full(m, HV_REFERENCE[0]) if reference is None else np.asarray(reference, dtype=float)
    pts = pts[(pts < ref).all(axis=1)]
    if len(pts) == 0:
        return 0.0
    if m == 1:
        return float(ref[0] - pts[:, 0].min())
    if m == 2:
        return hypervolume_2d(pts, ref)
    pts = pts[np.argsort(pts[:, -1], kind="stable")]
    volume = 0.0
    for i in range(len(pts)):
        depth = (pts[i + 1, -1] if i + 1 < len(pts) else ref[-1]) - pts[i, -1]
        if depth > 0:  # between this point's level and the next, the first i + 1 points dominate
            volume += depth * hypervolume(pts[:i + 1, :-1], ref[:-1])
    return float(volume)


def knee(points: np.ndarray) -> int:
    """Index (into ``points``, normalised minimisation space) of the knee of a 2-D front:
    the point farthest from the line joining the front's two extremes; with fewer than three
    points, or over more than two objectives, the one closest to the ideal (0, ..., 0)."""
    pts = np.asarray(points, dtype=float)
    if len(pts) < 3 or pts.shape[1] != 2:  # and over three or more objectives: nearest the ideal
        return int(np.argmin(np.linalg.norm(pts, axis=1)))
    order = np.argsort(pts[:, 0])
    a, b = pts[order[0]], pts[order[-1]]
    direction = b - a
    norm = np.hypot(*direction)
    if norm == 0:
        return int(order[0])
    dist = np.abs(direction[0] * (pts[:, 1] - a[1]) - direction[1] * (pts[:, 0] - a[0])) / norm
    # Points above the chord are not knees; they bulge the wrong way.
    below = (direction[0] * (pts[:, 1] - a[1]) - direction[1] * (pts[:, 0] - a[0])) <= 0
    dist = np.where(below, dist, -1)
    return int(np.argmax(dist))
