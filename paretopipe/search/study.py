"""A study shared by several workers through Optuna's storage (``--study URL``): each worker owns
one testbed and measures the configurations the shared sampler hands it, so that several testbeds
fill one front.

- ``journal:PATH`` (or a plain path): Optuna's journal file, for workers on one machine (the file
  is appended to under a lock; no heartbeats).
- ``postgresql://USER[:PASSWORD]@HOST[:PORT]/DB`` (also ``mysql://`` and ``sqlite:///``): Optuna's
  relational storage, for workers on several machines, with heartbeats: a worker that stops
  beating for ``GRACE_S`` has its running configuration failed and queued again
  (``RetryFailedTrialCallback``), and the next worker that asks takes it.

A study remembers what it searches (``IDENTITY_ATTR``: the model, the objectives and their
senses, the space): a worker whose search differs is refused in one line, so that a study is never
fed configurations of another model or scored by other objectives.
"""

from __future__ import annotations

import contextlib
import dataclasses
import re
import time
import warnings
from pathlib import Path
from typing import Any, Iterator, Sequence

from ..errors import UsageError

IDENTITY_ATTR = "paretopipe"
#: A worker beats every HEARTBEAT_S while it measures; one silent for GRACE_S is taken for dead.
HEARTBEAT_S = 5
GRACE_S = 30
#: How long a worker that found the study waits for its maker to write what it searches.
IDENTITY_WAIT_S = 10.0
#: How often a failed configuration is queued again before it stays failed.
MAX_RETRY = 2
RDB_SCHEMES = ("postgresql", "postgres", "mysql", "sqlite")


@dataclasses.dataclass(frozen=True)
class StudySpec:
    """Where a shared study lives and what its worker calls itself."""

    url: str
    name: str
    testbed: str
    identity: dict[str, Any] = dataclasses.field(default_factory=dict)  # what the study searches (identity())
    heartbeat_s: float = HEARTBEAT_S
    grace_s: float = GRACE_S

    @property
    def kind(self) -> str:
        return "rdb" if scheme(self.url) in RDB_SCHEMES else "journal"


def scheme(url: str) -> str:
    """The URL's database scheme (``postgresql+psycopg2`` -> ``postgresql``), or '' for a path."""
    m = re.match(r"^([a-z][a-z0-9+.-]*)://", url)
    return m.group(1).split("+")[0] if m else ""


def redacted(url: str) -> str:
    """``url`` without its password, for messages and records."""
    return re.sub(r"^([a-z][a-z0-9+.-]*://[^:/@]+):[^@]*@", r"\1:***@", url)


def journal_path(url: str) -> Path:
    return Path(url[len("journal:"):] if url.startswith("journal:") else url)


def check_url(url: str) -> str:
    """``url`` if it names a storage this module opens; a usage error saying what is valid if not."""
    s = scheme(url)
    if s and s not in RDB_SCHEMES:
        raise UsageError(f"--study {redacted(url)}: unknown storage {s!r}; give journal:PATH (workers on one "
                         f"machine) or postgresql://USER@HOST[:PORT]/DB (several machines)")
    if not s:
        path = journal_path(url)
        if not str(path) or not path.parent.is_dir():
            raise UsageError(f"--study {url}: the journal file's folder {path.parent} does not exist; give "
                             f"journal:PATH in an existing folder")
    return url


def open_storage(url: str, heartbeat_s: float = HEARTBEAT_S, grace_s: float = GRACE_S) -> Any:
    """The Optuna storage at ``url`` (a usage error, in one line, if it cannot be reached); a
    relational one beats every ``heartbeat_s`` and fails a trial silent for ``grace_s``."""
    # lazy for start-up: optuna and its database drivers (only a shared study needs them)
    import optuna

    check_url(url)
    if scheme(url) not in RDB_SCHEMES:  # a journal file
        backend = optuna.storages.journal.JournalFileBackend(str(journal_path(url)))
        return optuna.storages.JournalStorage(backend)
    kwargs: dict[str, Any] = {}
    if scheme(url) in ("postgresql", "postgres", "mysql"):
        kwargs["connect_args"] = {"connect_timeout": 5}
    # The driver the project installs (psycopg 3), whatever SQLAlchemy's default for the scheme.
    engine_url = re.sub(r"^postgres(ql)?://", "postgresql+psycopg://", url)
    try:
        return _rdb_storage(engine_url, kwargs, heartbeat_s, grace_s)
    except ImportError as exc:
        raise UsageError(f"--study {redacted(url)}: no database driver for it ({exc}); make installs PostgreSQL's "
                         f"(psycopg[binary])") from None
    except Exception as exc:  # sqlalchemy's errors: a refused connection, a wrong password, no database
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        password = re.match(r"^[a-z][a-z0-9+.-]*://[^:/@]+:([^@]*)@", url)
        if password and password.group(1):
            first = first.replace(password.group(1), "***")
        raise UsageError(f"--study {redacted(url)}: cannot open the study's database: {first}") from None


def _rdb_storage(engine_url: str, kwargs: dict[str, Any], heartbeat_s: float, grace_s: float,
                 attempts: int = 5) -> Any:
    """Optuna's relational storage. Workers that open a new database at the same instant each
    create its tables and types; PostgreSQL lets one of the same-named CREATEs win and refuses the
    others (a unique violation in pg_type, or "type ... already exists"), so a refused opener tries
    again once they exist."""
    # lazy for start-up: optuna and SQLAlchemy
    import optuna
    from sqlalchemy.exc import IntegrityError, ProgrammingError

    def storage() -> Any:
        with quiet():
            return optuna.storages.RDBStorage(
                engine_url, engine_kwargs=kwargs, heartbeat_interval=max(1, round(heartbeat_s)),
                grace_period=max(1, round(grace_s)),
                heartbeat_stale_trial_callback=optuna.storages.RetryHeartbeatStaleTrialCallback(max_retry=MAX_RETRY))

    for attempt in range(1, attempts):
        try:
            return storage()
        except (IntegrityError, ProgrammingError) as exc:
            if "already exists" not in str(exc) and "duplicate key" not in str(exc):
                raise
            time.sleep(0.2 * attempt)
    return storage()


@contextlib.contextmanager
def quiet() -> Iterator[None]:
    """Optuna's warnings about the parts of its API a shared study uses as documented: heartbeats
    (experimental) and heartbeats outside ``study.optimize`` (an ask-and-tell loop beats itself)."""
    # lazy for start-up: optuna
    import optuna

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        warnings.filterwarnings("ignore", message="Heartbeat of storage is supposed to be used with Study.optimize")
        yield


def identity(model: str, objectives: dict[str, str], space: dict[str, Sequence[Any]]) -> dict[str, Any]:
    """What a study searches, as it stores it (JSON: lists, not tuples)."""
    return {"model": model, "objectives": [[n, s] for n, s in objectives.items()],
            "space": {name: list(choices) for name, choices in space.items()}}


def differences(stored: dict[str, Any], wanted: dict[str, Any]) -> list[str]:
    """How ``wanted`` differs from the identity a study was created with."""
    out = []
    if stored.get("model") != wanted["model"]:
        out.append(f"model {stored.get('model')} (this search: {wanted['model']})")
    if stored.get("objectives") != wanted["objectives"]:
        have = ",".join(f"{n} ({s})" for n, s in stored.get("objectives") or [])
        out.append(f"objectives {have} (this search: {','.join(f'{n} ({s})' for n, s in wanted['objectives'])})")
    if stored.get("settings") != wanted.get("settings"):
        have = stored.get("settings") or {}
        diff = [f"{k} {have.get(k)} (this search: {v})" for k, v in (wanted.get("settings") or {}).items()
                if have.get(k) != v]
        out.append("settings " + ", ".join(diff))
    if stored.get("space") != wanted["space"]:
        have = stored.get("space") or {}
        diff = [n for n in sorted(set(have) | set(wanted["space"])) if have.get(n) != wanted["space"].get(n)]
        out.append(f"another space (dimension{'s' if len(diff) > 1 else ''} {', '.join(diff)} differ)")
    return out


def open_study(spec: StudySpec, directions: Sequence[str], sampler: Any) -> tuple[Any, bool]:
    """(the study, whether this worker created it): created with ``spec.identity``, or loaded and
    checked against it."""
    # lazy for start-up: optuna
    import optuna

    storage = open_storage(spec.url, spec.heartbeat_s, spec.grace_s)
    created = False
    try:
        study = optuna.create_study(storage=storage, study_name=spec.name, directions=list(directions),
                                    sampler=sampler)
        study.set_user_attr(IDENTITY_ATTR, spec.identity)
        created = True
    except optuna.exceptions.DuplicatedStudyError:
        study = optuna.load_study(study_name=spec.name, storage=storage, sampler=sampler)
    stored = study.user_attrs.get(IDENTITY_ATTR)
    deadline = time.monotonic() + IDENTITY_WAIT_S
    while stored is None and not created and time.monotonic() < deadline:
        time.sleep(0.1)   # its maker writes the identity right after making it
        stored = study.user_attrs.get(IDENTITY_ATTR)
    if stored is None and not created:
        raise UsageError(f"--study {redacted(spec.url)}: study {spec.name!r} was not made by paretopipe search "
                         f"(it has no {IDENTITY_ATTR!r} attribute); name another with --study-name")
    if [d.name.lower()[:3] for d in study.directions] != [d[:3] for d in directions]:
        raise UsageError(f"--study {redacted(spec.url)}: study {spec.name!r} has {len(study.directions)} objectives "
                         f"({', '.join(d.name.lower() for d in study.directions)}), this search "
                         f"{len(directions)} ({', '.join(directions)}); name another with --study-name")
    changed = differences(stored, spec.identity)
    if changed:
        raise UsageError(f"--study {redacted(spec.url)}: study {spec.name!r} searches {'; '.join(changed)}; "
                         f"give the same options or name another study with --study-name")
    return study, created
