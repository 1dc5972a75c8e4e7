"""``predict --subsets``: which devices to use, printed (:mod:`paretopipe.predict.subsets`): every
placement's best figures, then per objective what each extra device buys or costs; for a
language model with ``--validate``, the same from measured sessions beside the prediction."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any, Sequence

from .. import records
from ..envfile import read_env
from ..errors import UsageError
from ..network.conditions import get_conditions
from ..analysis.devices import GAIN_WORDS, testbed_hosts
from ..predict import subsets
from ..predict.planner import split_blocks


def print_image_subsets(profiles, conditions, args: argparse.Namespace, codec: str, out: Path | None) -> int:
    """Every placement's best latency and throughput, then per objective the best with k devices
    against the best with one fewer, per network."""
    # lazy for start-up: pandas (the profiles' split positions)
    from ..predict.predictions import split_positions

    if args.links:
        raise UsageError("--subsets prices every hop over --network's conditions; --links names the hops of one "
                         "placement: drop one of them")
    names = [p.name for p in profiles]
    positions = [b for _, b in split_positions(profiles[0], args.fine)]
    rows = []
    for (up, down), *_ in conditions:
        priced = subsets.price(profiles, up, down, args.batch_size, positions, codec)
        print(f"\n{profiles[0].model}: which devices, network {up.name} (predicted; {len(priced)} placements, "
              f"{names[0]} the data source)")
        print(f"{'placement':<40} {'best latency ms':>15} {'--split-blocks':>15} {'best img/s':>10} {'--split-blocks':>15}")
        for placed in priced:
            fast, wide = placed.best("latency"), placed.best("throughput")
            chain = [profiles[i] for i in placed.devices]
            print(f"{' -> '.join(names[i] for i in placed.devices):<40} {fast.latency_s * 1e3:>15.2f} "
                  f"{split_blocks(fast, chain[0]):>15} {wide.throughput_imgs_per_s:>10.2f} {split_blocks(wide, chain[0]):>15}")
        print("what each extra device buys (the best placement with k devices against the best with k - 1):")
        for row in subsets.marginal_gains(priced, names):
            unit = "ms" if row["objective"] == "latency" else "img/s"
            value = row["value"] * 1e3 if row["objective"] == "latency" else row["value"]
            print(f"  {row['objective']:<10} {row['devices']} devices: {value:.2f} {unit} on {row['placement']}"
                  f"{_change(row)}")
            rows.append({"network": up.name, **row, "cuts": ",".join(map(str, row["cuts"]))})
    if out:
        print(f"written: {records.atomic_write_csv(out / 'subsets.csv', rows)}")
    return 0


def _change(row: dict[str, Any]) -> str:
    return "" if row["gain"] is None else f"  x{row['vs_one_fewer']:.3f} ({GAIN_WORDS[row['gain']]})"


def print_generation_subsets(shape: Any, profiles: list[dict[str, Any]], names: list[str], networks: list[str],
                             args: argparse.Namespace) -> int:
    """A language model's placements: each one's least time to first token and per token with their
    splits, then per objective the best with k devices against the best with one fewer; with
    ``--validate`` (sessions measured on the hosts of ``--env-file``), the measured gains beside."""
    measured = _measured_sessions(args) if args.validate else None
    rows = []
    for name in networks:
        conditions = None if name == "unshaped" else get_conditions(name, args.network_file)
        for plen in args.prompt_len:
            priced = subsets.price_generation(shape, profiles, conditions, plen, args.wire_dtype)
            print(f"\n{shape.name}: which devices, network {name}, prompt {plen} (predicted; {len(priced)} placements, "
                  f"{names[0]} the data source)")
            print(f"{'placement':<40} {'TTFT ms':>9} {'--split-blocks':>15} {'TPOT ms':>9} {'--split-blocks':>15}")
            for placed in priced:
                (ttft, first), (tpot, per) = placed.figure("ttft"), placed.figure("tpot")
                print(f"{' -> '.join(names[i] for i in placed.devices):<40} {ttft * 1e3:>9.2f} "
                      f"{','.join(map(str, first)):>15} {tpot * 1e3:>9.2f} {','.join(map(str, per)):>15}")
            gains = subsets.marginal_gains(priced, names, subsets.GENERATION_OBJECTIVES)
            seen = _measured_gains(measured, names, name, plen) if measured else {}
            print("what each extra device buys (the best placement with k devices against the best with k - 1)"
                  + ("; measured beside:" if measured else ":"))
            for row in gains:
                m = seen.get((row["objective"], row["devices"]))
                print(f"  {row['objective']:<10} {row['devices']} devices: {row['value'] * 1e3:.2f} ms on "
                      f"{row['placement']}{_change(row)}" + (_measured_line(row, m) if measured else ""))
                rows.append({"network": name, "prompt_len": plen, **row, "cuts": ",".join(map(str, row["cuts"])),
                             **_measured_columns(row, m)})
    if args.out:
        print(f"written: {records.atomic_write_csv(Path(args.out) / 'subsets.csv', rows)}")
    return 0


def _measured_sessions(args: argparse.Namespace) -> tuple[list[tuple[list[str], list[dict]]], list[str]]:
    """The sessions ``--validate`` names (comma-separated), each with its testbed's hosts in order,
    and the devices' addresses: ``--env-file``'s HOSTS, in the profiles' order."""
    # lazy for start-up: pandas (a session's summary)
    from ..analysis.session import find_session

    addresses = [h.strip() for h in read_env(args.env_file).get("HOSTS", "").split(",") if h.strip()]
    if not addresses:
        raise UsageError(f"--subsets --validate: {args.env_file} names no HOSTS; give --env-file whose HOSTS are the "
                         f"profiled devices, in the profiles' order")
    sessions = []
    for path in (p.strip() for p in args.validate.split(",") if p.strip()):
        session = find_session(path)
        sessions.append((testbed_hosts(session.read_meta()), session.configs().to_dict("records")))
    return sessions, addresses


def _measured_gains(measured: tuple[list, list[str]], names: Sequence[str], network: str,
                    prompt_len: int) -> dict[tuple[str, int], dict[str, Any]]:
    sessions, addresses = measured
    placed = subsets.measured_generation(sessions, addresses, network, prompt_len)
    rows = subsets.marginal_gains(placed, names, subsets.GENERATION_OBJECTIVES) if placed else []
    return {(r["objective"], r["devices"]): r for r in rows}


def _measured_line(predicted: dict[str, Any], measured: dict[str, Any] | None) -> str:
    if measured is None:
        return "; measured: no session ran this many devices"
    verdict = "" if predicted["gain"] is None else \
        ": agrees" if measured["gain"] == predicted["gain"] else ": disagrees"
    return f"; measured {measured['value'] * 1e3:.2f} ms on {measured['placement']}{_change(measured)}{verdict}"


def _measured_columns(predicted: dict[str, Any], measured: dict[str, Any] | None) -> dict[str, Any]:
    if measured is None:
        return {}
    return {"measured_value": measured["value"], "measured_placement": measured["placement"],
            "measured_cuts": ",".join(map(str, measured["cuts"])), "measured_vs_one_fewer": measured["vs_one_fewer"],
            "measured_gain": measured["gain"],
            "agrees": None if predicted["gain"] is None else measured["gain"] == predicted["gain"]}
