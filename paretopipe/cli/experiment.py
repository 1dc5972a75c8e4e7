"""Experiment files: one TOML file describes a sweep; every session stores its own, resolved.

An experiment file has three tables::

    [sweep]            # the sweep's options, named as its flags (--batch-size -> batch_size)
    models = ["mobilenetv2"]
    networks = ["lan", "edge"]
    batch_size = 1

    [networks.edge]    # network conditions inline, in profiles.toml's keys (optional)
    rate = "20mbit"
    delay = "10ms"

    [hosts]            # env_file = ".env", or the hosts inline (the secret stays in .env)
    list = [{address = "10.0.0.2", user = "pi"}, {address = "10.0.0.3", user = "gpu", device = "cuda"}]

Values in ``[sweep]`` become the flags' defaults, so flags given on the command line override the
file and are checked by the same converters. A session folder holds ``experiment.toml``: every
option resolved and every network's values written out, so ``--rerun SESSION`` repeats it
exactly even after profiles.toml changes, and ``--resume`` can tell which options differ.
"""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path
from typing import Any

from .. import records
from ..errors import UsageError
# INVOCATION: flags that say how to run this invocation, never taken from a file; HARMLESS: options
# whose change does not change what is measured (--resume may change them freely). Both are marked
# in the sweep's option table.
from .sweep_flags import HARMLESS, INVOCATION
from ..records import atomic_write_text

try:  # Python >= 3.11
    import tomllib
except ModuleNotFoundError:  # pragma: no cover - Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]

FILE_NAME = "experiment.toml"
#: Friendlier spellings in files, mapped to the flag they set.
ALIASES = {"networks": "network", "profiles": "network", "backends": "backend", "devices": "stage_devices",
           "model_name": "model", "output_dir": "out", "split_block_lists": "split_blocks"}


@dataclasses.dataclass
class Experiment:
    """What a file or a stored session contributes: flag defaults, inline networks and hosts."""

    defaults: dict[str, Any]
    networks: dict[str, dict[str, Any]]
    hosts: dict[str, Any] | None
    path: Path | None
    resolved: dict[str, Any] | None = None  # a stored session's [sweep], for --resume's comparison


def read(path: str | Path, parser: argparse.ArgumentParser) -> Experiment:
    """Parse an experiment file against ``parser``'s flags; an unknown key is named with the valid ones."""
    path = Path(path)
    data = records.read_toml(path, "experiment file", ".toml")
    unknown = sorted(set(data) - {"sweep", "networks", "hosts"})
    if unknown:
        raise UsageError(f"experiment file {path}: unknown table [{unknown[0]}]; valid: [sweep], [networks.NAME], "
                         f"[hosts]")
    actions = {a.dest: a for a in parser._actions if a.dest not in INVOCATION and a.option_strings}
    defaults: dict[str, Any] = {}
    for key, value in (data.get("sweep") or {}).items():
        dest = ALIASES.get(key, key).replace("-", "_")
        if dest not in actions:
            raise UsageError(f"experiment file {path}: unknown option {key!r} in [sweep]; valid: "
                             f"{', '.join(sorted(actions))}")
        defaults[dest] = _as_flag_value(value, actions[dest], f"{path} [sweep] {key}")
    networks = data.get("networks") or {}
    if not isinstance(networks, dict) or any(not isinstance(v, dict) for v in networks.values()):
        raise UsageError(f"experiment file {path}: [networks] holds one table per network, e.g. [networks.edge]")
    # Relative trace files are relative to the experiment file, as in profiles.toml.
    networks = {name: _absolute_traces(values, path.parent) for name, values in networks.items()}
    hosts = data.get("hosts")
    if hosts is not None and not isinstance(hosts, dict):
        raise UsageError(f"experiment file {path}: [hosts] must be a table (env_file = \".env\" or list = [...])")
    if hosts and "env_file" in hosts:
        defaults["env_file"] = str(hosts["env_file"])
        hosts = {k: v for k, v in hosts.items() if k != "env_file"} or None
    return Experiment(defaults, networks, hosts, path)


def _as_flag_value(value: Any, action: argparse.Action, where: str) -> Any:
    """A TOML value as the flag's default: lists joined as the flag writes them, scalars as text so
    that argparse's own converter checks them (it converts string defaults)."""
    if isinstance(action, (argparse._StoreTrueAction, argparse._StoreFalseAction)):
        if not isinstance(value, bool):
            raise UsageError(f"{where}: give true or false, not {value!r}")
        return value
    if isinstance(value, list):
        if all(isinstance(v, list) for v in value) and value:  # plans: [[3, 9], [5, 12]]
            return ";".join(",".join(str(x) for x in plan) for plan in value)
        return ",".join(str(v) for v in value)
    if isinstance(value, bool):
        raise UsageError(f"{where}: {value!r} is not a value for --{action.dest.replace('_', '-')}")
    if isinstance(value, (int, float, str)):
        text = str(value)
        if action.choices is not None and text not in action.choices:
            raise UsageError(f"{where}: {text!r}; valid: {', '.join(map(str, action.choices))}")
        return text
    raise UsageError(f"{where}: {type(value).__name__} is not a value for --{action.dest.replace('_', '-')}")


def _absolute_traces(values: dict[str, Any], base: Path) -> dict[str, Any]:
    out = dict(values)
    for key, value in values.items():
        if key.startswith("trace") and isinstance(value, str) and value and not Path(value).is_absolute():
            out[key] = str((base / value).resolve())
    return out


def stored(session_dir: Path, parser: argparse.ArgumentParser) -> Experiment | None:
    """A session's stored experiment (None for sessions older than experiment files)."""
    path = session_dir / FILE_NAME
    if not path.is_file():
        return None
    exp = read(path, parser)
    exp.resolved = tomllib.loads(path.read_text()).get("sweep") or {}
    return exp


def differences(before: dict[str, Any], now: dict[str, Any]) -> list[str]:
    """``option: session has A, now B`` for each measured option that differs."""
    keys = sorted((set(before) | set(now)) - HARMLESS)
    return [f"{k}: session has {before.get(k)!r}, now {now.get(k)!r}" for k in keys if before.get(k) != now.get(k)]


def write(path: Path, sweep: dict[str, Any], networks: dict[str, dict[str, Any]],
          hosts: dict[str, Any] | None) -> None:
    """The resolved experiment, atomically, as TOML (None values left out: TOML has no null)."""
    import tomli_w


    doc: dict[str, Any] = {"sweep": {k: v for k, v in sweep.items() if v is not None}}
    if networks:
        doc["networks"] = {n: {k: v for k, v in vals.items() if v is not None} for n, vals in networks.items()}
    if hosts:
        doc["hosts"] = hosts
    header = ("# The resolved experiment of this session: rerun it with\n"
              "#   paretopipe sweep --rerun <this folder>\n")
    atomic_write_text(path, header + tomli_w.dumps(doc))
