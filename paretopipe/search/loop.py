"""The search: Optuna's ask-and-tell loop over a :class:`~.space.Space`, within a budget of
distinct configurations, each measured once.

The cost model's predictions (from device profiles) are measured first, enqueued in their order:
its front, then the front of what is left, and so on (non-dominated sorting), up to
:data:`PREDICTED_SHARE` of the budget (:func:`predicted_first`); then the sampler explores. A model
whose segment times are off by a quarter still puts the measured front among its first few
layers, where the front alone of a wrong model misses a corner of it (benchmarks/search.py). A
sampler that proposes a configuration already measured is not measured again: that proposal
fails (told again, it would weigh twice in the sampler's model) and a configuration not measured
yet, drawn at random, is measured instead, so the budget counts measurements. Each trial keeps
where it came from (``prediction``, ``sampler`` or ``fill``)."""

from __future__ import annotations

import dataclasses
import logging
import os
import random
import socket
import time
from typing import Any, Callable, Sequence

import numpy as np

from ..analysis import pareto
from ..errors import UsageError
from .samplers import DEFAULT_SAMPLER, make_sampler
from .space import Config, Space
from .study import StudySpec, open_study, quiet

log = logging.getLogger("paretopipe.search")
#: Proposals per unit of budget before a search that keeps proposing measured configurations ends.
MAX_PROPOSALS_PER_BUDGET = 20
#: A worker whose study's remaining configurations are all being measured elsewhere looks again after this.
WAIT_POLL_S = 1.0
#: Trial attributes (user attributes, so that every worker reads them).
ORIGIN, MEASURED, REPEAT, TESTBED, WORKER, RETRY_OF = "origin", "measured", "repeat", "testbed", "worker", "retry_of"


#: The share of a search's budget the predicted layers may take before the sampler explores (the
#: whole predicted front is measured even past it, up to the budget).
PREDICTED_SHARE = 0.5


def predicted_first(configs: Sequence[Any], values: Sequence[Sequence[float]], senses: Sequence[str], budget: int,
                    groups: Sequence[Any] | None = None, share: float = PREDICTED_SHARE) -> list[Any]:
    """``configs`` in the order a search measures them first: layer by layer of the predicted
    ``values``' non-dominated sorting (each of ``groups``, e.g. networks, ranked on its own: they
    do not dominate each other), by the first objective within a layer; the whole predicted front,
    then further layers up to ``share`` of ``budget``, and never more than ``budget`` (a front of
    ties, as two identical devices predict, can hold the whole space)."""
    keys = list(groups) if groups is not None else [None] * len(configs)
    rank = np.zeros(len(configs), dtype=int)
    for g in dict.fromkeys(keys):
        idx = [i for i, k in enumerate(keys) if k == g]
        rank[idx] = pareto.ranks(np.asarray([values[i] for i in idx], dtype=float), senses)
    first = [v[0] if senses[0] == "min" else -v[0] for v in values]
    order = sorted(range(len(configs)), key=lambda i: (rank[i], first[i]))
    front = int(np.sum(rank == 0))
    if front > budget:
        log.warning("the predicted front holds %d configurations, more than the budget of %d: its first %d by the "
                    "first objective are measured", front, budget, budget)
    keep = min(budget, max(front, int(share * budget)))
    return [configs[i] for i in order[:keep]]


@dataclasses.dataclass(frozen=True)
class Trial:
    """One configuration measured: its objectives (None: infeasible) and where it came from."""

    config: Config
    values: tuple[float, ...] | None
    origin: str  # "prediction", "sampler", "fill" (drawn at random after the sampler repeated itself), or
    #              "retry" (a configuration a dead worker was measuring)


@dataclasses.dataclass
class SearchResult:
    space: Space
    objectives: dict[str, str]
    sampler: str
    trials: list[Trial]
    proposals: int  # suggestions made, repeats of measured configurations included
    study_measured: int | None = None  # a shared study: configurations measured by all its workers

    def points(self, first: int | None = None) -> np.ndarray:
        """The objectives of the feasible configurations among the first ``first`` measured."""
        vals = [t.values for t in self.trials[:first] if t.values is not None]
        return np.array(vals, dtype=float).reshape(-1, len(self.objectives))

    def hypervolume(self, lower: np.ndarray, upper: np.ndarray, first: int | None = None) -> float:
        """The hypervolume of the front of the first ``first`` configurations, normalised to
        ``lower``..``upper`` (those of the whole space, to compare with its exhaustive front)."""
        return normalised_hypervolume(self.points(first), list(self.objectives.values()), lower, upper)


def bounds(points: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each objective's least and greatest value over ``points`` (for :func:`normalised_hypervolume`)."""
    pts = np.asarray(points, dtype=float)
    return pts.min(axis=0), pts.max(axis=0)


def normalised_hypervolume(points: np.ndarray, senses: Sequence[str], lower: np.ndarray, upper: np.ndarray) -> float:
    """The hypervolume of ``points``' front in [0, 1] minimisation space (reference 1.1), as the
    report computes a front's."""
    pts = np.asarray(points, dtype=float)
    if len(pts) == 0:
        return 0.0
    norm = pareto.normalise(pts, senses, lower, upper)
    return pareto.hypervolume(norm[pareto.front_mask(norm, ["min"] * norm.shape[1])])


def search(space: Space, evaluate: Callable[[Config], tuple[float, ...] | None], objectives: dict[str, str],
           budget: int, sampler: str = DEFAULT_SAMPLER, seed: int = 0, seeds: Sequence[Config] = (),
           startup: int = 10, on_trial: Callable[[Trial], None] | None = None,
           shared: StudySpec | None = None, on_join: Callable[[Any, bool], None] | None = None) -> SearchResult:
    """Measure at most ``budget`` distinct configurations of ``space``: ``seeds`` (the predicted
    front) first, then the ``sampler``'s. ``evaluate`` measures one (None: infeasible). With
    ``shared``, the study lives in shared storage: the budget and the rule that nothing is measured
    twice hold for the whole study, whatever its workers, and the result lists this worker's trials;
    ``on_join(study, created)`` runs once the study is open, before any trial (a testbed's
    reference measurement)."""
    # lazy for start-up: optuna (only a search needs it)
    import optuna

    total = space.size()
    if total == 0:
        raise UsageError("the search space is empty")
    if budget < 1:
        raise UsageError(f"--budget {budget}: give at least 1 configuration")
    seeds = list(dict.fromkeys(space.normalise(space.as_dict(c)) for c in seeds))
    if len(seeds) > budget:
        raise UsageError(f"--budget {budget} is below the predicted front's {len(seeds)} configurations, which are "
                         f"measured first: give at least {len(seeds)}")
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    directions = ["minimize" if s == "min" else "maximize" for s in objectives.values()]
    made = make_sampler(sampler, seed, startup + len(seeds))
    if shared is None:
        return _search(space, evaluate, objectives, budget, sampler, seed, seeds, on_trial, None,
                       optuna.create_study(directions=directions, sampler=made), True)
    with quiet():
        study, fresh = open_study(shared, directions, made)
        if on_join is not None:
            on_join(study, fresh)
        return _search(space, evaluate, objectives, budget, sampler, seed, seeds, on_trial, shared, study, fresh)


def _search(space: Space, evaluate: Callable[[Config], tuple[float, ...] | None], objectives: dict[str, str],
            budget: int, sampler: str, seed: int, seeds: Sequence[Config], on_trial: Callable[[Trial], None] | None,
            shared: StudySpec | None, study: Any, fresh: bool) -> SearchResult:
    """The loop of :func:`search` on an opened study (``fresh``: this search made it)."""
    # lazy for start-up: optuna
    import optuna

    dists = {d.name: optuna.distributions.IntDistribution(0, len(d.choices) - 1) if d.ordered
             else optuna.distributions.CategoricalDistribution(list(range(len(d.choices)))) for d in space.dims}
    if fresh:  # a study joined is already seeded, by the worker that made it
        for config in seeds:
            study.enqueue_trial(_params(space, config), user_attrs={ORIGIN: "prediction"})
    trials: list[Trial] = []
    proposals = 0
    goal = min(budget, space.size())
    rng = random.Random(seed)
    while proposals < MAX_PROPOSALS_PER_BUDGET * budget:
        if shared is not None:
            reap_dead_workers(study, shared)
        state = StudyState.of(study, space)
        if len(state.measured) >= goal:
            break
        if len(state.measured) + len(state.claimed) >= goal and not state.waiting:
            # The rest of the budget is being measured by other workers: wait for them, or for
            # one to be found dead, when its configuration is queued again.
            time.sleep(WAIT_POLL_S)
            continue
        trial = study.ask(dists)
        config = _config(space, trial.params)
        # A trial asked afresh has no worker yet: one that has is a dead worker's, queued again
        # (by Optuna's retry callback, which copies the user attributes, or by reap_dead_workers).
        origin = "retry" if WORKER in trial.user_attrs or RETRY_OF in trial.user_attrs \
            else trial.user_attrs.get(ORIGIN, "sampler")
        proposals += 1
        # Another worker may have asked for the same configuration, or for the budget's last one,
        # between this worker's look at the study and its ask: the earlier trial keeps it.
        before = earlier_claims(study, trial, space) if shared is not None else set()
        if _told_as_repeat(study, trial, config, space, state, before, goal, rng):
            continue
        if shared is not None:
            trial.set_user_attr(TESTBED, shared.testbed)
            trial.set_user_attr(WORKER, {"host": socket.gethostname(), "pid": os.getpid()})
        with _heartbeat(study, trial):
            values = evaluate(config)
        trial.set_user_attr(MEASURED, True)
        trials.append(Trial(config, values, origin))
        if on_trial is not None:
            on_trial(trials[-1])
        _tell(study, trial, values)
    measured = len(StudyState.of(study, space).measured)
    if measured < goal:
        log.warning("the %s sampler kept proposing measured configurations: %d of %d measured after %d proposals",
                    sampler, measured, goal, proposals)
    return SearchResult(space, dict(objectives), sampler, trials, proposals,
                        study_measured=measured if shared is not None else None)


def _told_as_repeat(study: Any, trial: Any, config: Config, space: Space, state: StudyState, before: set,
                    goal: int, rng: random.Random) -> bool:
    """A trial not to measure, told as a repeat: its configuration is measured or claimed already,
    outside the space (a plan whose cuts coincide where they must differ, Space.valid), or the
    budget went to trials asked before this one."""
    if config in state.measured or config in state.claimed or config in before or not space.valid(config):
        # A repeat would be measured for nothing, and told again it would weigh twice in the
        # sampler's model (TPE then circles its best region): it fails, marked as a repeat, and
        # a configuration not measured yet, drawn at random, is asked next.
        trial.set_user_attr(REPEAT, True)
        _tell(study, trial, None)
        fill = _unmeasured(space, {**state.measured, **dict.fromkeys(state.claimed | before)}, rng)
        if fill is not None and not state.waiting:
            study.enqueue_trial(_params(space, fill), user_attrs={ORIGIN: "fill"})
        return True
    if len(before) >= goal:
        trial.set_user_attr(REPEAT, True)
        _tell(study, trial, None)
        return True
    return False


def _params(space: Space, config: Config) -> dict[str, int]:
    return {d.name: d.choices.index(v) for d, v in zip(space.dims, config)}


def _has_all(space: Space, params: dict[str, int]) -> bool:
    """A trial's parameters are all there: a worker suggests them one at a time, so another worker
    may read a running trial between two of them."""
    return bool(params) and all(d.name in params for d in space.dims)


def _config(space: Space, params: dict[str, int]) -> Config:
    """The configuration of a trial's parameters (each dimension's choice index): :func:`_params` reversed."""
    return space.normalise({d.name: d.choices[params[d.name]] for d in space.dims})


@dataclasses.dataclass
class StudyState:
    """What a study holds: the configurations measured (values, or None: infeasible or failed),
    those being measured now, and how many trials wait to be asked."""

    measured: dict[Config, tuple[float, ...] | None]
    claimed: set[Config]
    waiting: int

    @classmethod
    def of(cls, study: Any, space: Space) -> "StudyState":
        # lazy for start-up: optuna
        from optuna.trial import TrialState

        measured: dict[Config, tuple[float, ...] | None] = {}
        claimed: set[Config] = set()
        waiting = 0
        for t in study.get_trials(deepcopy=False):
            if t.state == TrialState.WAITING:
                waiting += 1
                continue
            if not _has_all(space, t.params) or t.user_attrs.get(REPEAT):
                continue
            config = _config(space, t.params)
            if t.state == TrialState.COMPLETE:
                measured[config] = tuple(t.values)
            elif t.state == TrialState.FAIL and t.user_attrs.get(MEASURED):
                measured.setdefault(config, None)
            elif t.state == TrialState.RUNNING:
                claimed.add(config)
        return cls(measured, claimed - set(measured), waiting)


def earlier_claims(study: Any, trial: Any, space: Space, wait_s: float = 5.0) -> set[Config]:
    """The configurations measured, or being measured, by the study's trials numbered before
    ``trial`` (repeats aside). A trial's number is given when it is made and its parameters a
    moment later: an earlier running trial without them yet is waited for (up to ``wait_s``)."""
    # lazy for start-up: optuna
    from optuna.trial import TrialState

    deadline = time.monotonic() + wait_s
    while True:
        earlier = [t for t in study.get_trials(deepcopy=False) if t.number < trial.number
                   and t.state in (TrialState.RUNNING, TrialState.COMPLETE, TrialState.FAIL)
                   and not t.user_attrs.get(REPEAT)]
        if all(_has_all(space, t.params) for t in earlier if t.state == TrialState.RUNNING) or \
                time.monotonic() >= deadline:
            break
        time.sleep(0.05)
    return {_config(space, t.params) for t in earlier
            if _has_all(space, t.params) and (t.state != TrialState.FAIL or t.user_attrs.get(MEASURED))}


def reap_dead_workers(study: Any, shared: StudySpec) -> list[int]:
    """Fail the running trials of workers found dead and queue their configurations again: by
    heartbeat in a relational study (Optuna's own, whose callback queues the copy), by process
    in a journal study (its workers share this machine: a worker whose process is gone is dead).
    The numbers of the trials failed."""
    # lazy for start-up: optuna
    import optuna
    from optuna.trial import TrialState

    if shared.kind == "rdb":
        before = {t.number for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))}
        optuna.storages.fail_stale_trials(study)
        after = {t.number for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))}
        return sorted(before - after - {t.number for t in study.get_trials(deepcopy=False,
                                                                          states=(TrialState.COMPLETE,))})
    reaped = []
    here = socket.gethostname()
    for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        worker = t.user_attrs.get(WORKER) or {}
        if worker.get("host") != here or _alive(int(worker.get("pid", 0))):
            continue
        try:
            study.tell(t.number, state=TrialState.FAIL)
        except (ValueError, RuntimeError):  # another worker reaped it first
            continue
        log.warning("worker %s died measuring trial %d: its configuration is queued again", worker.get("pid"), t.number)
        study.enqueue_trial(dict(t.params), user_attrs={ORIGIN: t.user_attrs.get(ORIGIN, "sampler"), RETRY_OF: t.number},
                            skip_if_exists=False)
        reaped.append(t.number)
    return reaped


def _alive(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # a process of another user: alive
        return True
    return True


def _heartbeat(study: Any, trial: Any) -> Any:
    """Optuna's heartbeat for ``trial`` while it is measured (a relational study; nothing for
    the others). Optuna starts it only inside ``study.optimize``; an ask-and-tell loop starts its
    own, through the same (private) helper."""
    # lazy for start-up: optuna
    from optuna.storages._heartbeat import get_heartbeat_thread

    return get_heartbeat_thread(trial._trial_id, study._storage)


def _unmeasured(space: Space, measured: dict, rng: random.Random, tries: int = 200) -> Config | None:
    """A configuration not measured yet, uniformly at random (None when none is found)."""
    for _ in range(tries):
        config = space.normalise({d.name: rng.choice(d.choices) for d in space.dims})
        if config not in measured and space.valid(config):
            return config
    return None


def _tell(study: Any, trial: Any, values: tuple[float, ...] | None) -> None:
    # lazy for start-up: optuna
    from optuna.trial import TrialState

    if values is None:
        study.tell(trial, state=TrialState.FAIL)
    else:
        study.tell(trial, list(values))
