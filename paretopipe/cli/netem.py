"""``network_delay.py`` and ``paretopipe netem``: apply, clear, show and measure network conditions."""

from __future__ import annotations

import argparse
import ipaddress
import json
import logging
import threading
from pathlib import Path
from typing import Any, Sequence

from .. import records
from ..errors import UsageError
from ..argtypes import host_port
from ..options import flags
from ..network import probe, tc, tctree, tracecontrol
from ..network.conditions import Direction, load_conditions
from .common import (ArgumentParser, HelpFormatter, add_common_flags, add_network_flags, example_epilog,
                     network_from_args, positive_float, positive_int, setup_logging,
                     signals_as_interrupt)

log = logging.getLogger("paretopipe.netem")


def _target(p: argparse.ArgumentParser) -> None:
    p.add_argument("--dev", required=True, help="interface to shape, e.g. eth0, wlan0")
    p.add_argument("--ssh", default=None, help="user@host: run the tc commands on that peer (key-based SSH)")
    p.add_argument("--ssh-key", default=None, help="private key for --ssh (ssh's own when not given)")
    p.add_argument("--sudo", action="store_true", help="prefix commands with sudo -n (for a non-root SSH user)")
    p.add_argument("--netns", default=None, help="run inside this network namespace (a lab host's)")


def _duration(p: argparse.ArgumentParser, help_: str) -> None:
    p.add_argument("--duration", type=positive_float, default=None, help=help_)


def _relay_parser(sub: Any) -> None:
    """``netem relay``: a foreign peer's connections over the emulated link (network/relay.py)."""
    relay = sub.add_parser("relay", help="carry another program's TCP connections over the emulated link, and "
                                         "count their bytes and round trips", formatter_class=HelpFormatter)
    add_network_flags(relay)
    relay.add_argument("--to", required=True, metavar="HOST:PORT",
                       help="the peer the relay forwards to (a numeric address: nothing is looked up)")
    flags.HOST.add_to(relay, default="127.0.0.1", help="address the relay listens on")
    flags.PORT.add_to(relay, required=True, help="port the relay listens on (the client connects here)")
    _duration(relay, "stop after this many seconds (default: at Ctrl-C or SIGTERM)")
    flags.SEED.add_to(relay, help="seed of the link's jitter, loss and a trace's start")
    flags.OUT.add_to(relay, help="write the counts here as JSON when the relay stops")


def parser(prog: str = "network_delay.py") -> ArgumentParser:
    top = ArgumentParser(
        prog=prog, formatter_class=HelpFormatter,
        description="Apply named network conditions with tc (delay, jitter, loss and rate together), clear "
                    "them, show what the kernel has, and measure a link for real.",
        epilog=example_epilog(
            "sudo python network_delay.py apply --network lte --dev eth0",
            "sudo python network_delay.py apply --delay 50ms --jitter 5ms --rate 10mbit --dev eth0 --port 5555 --ingress",
            "python network_delay.py apply --network 3g --dev eth0 --dry-run",
            "sudo python network_delay.py apply --trace cellular.up --dev eth0 --duration 60 --trace-log rates.csv",
            "sudo python network_delay.py clear --dev eth0",
            "python network_delay.py show --dev eth0",
            "python network_delay.py serve --port 5201      # on the peer",
            "python network_delay.py measure --host 192.168.1.20 --port 5201 --out link.json",
            "python network_delay.py networks"))
    sub = top.add_subparsers(dest="cmd", required=True, parser_class=ArgumentParser)
    ap = sub.add_parser("apply", help="apply network conditions (idempotent)", formatter_class=HelpFormatter)
    add_network_flags(ap)
    ap.add_argument("--ingress", action="store_true",
                    help="shape incoming traffic too, with the down direction (through an ifb device)")
    flags.PORT.add_to(ap, help="shape only TCP traffic to/from this port (SSH stays untouched)")
    flags.DRY_RUN.add_to(ap, help="print the commands, change nothing (no root needed)")
    _duration(ap, "hold the conditions this many seconds (or until Ctrl-C), then clear them")
    ap.add_argument("--trace-interval", type=positive_float, default=tracecontrol.DEFAULT_INTERVAL_S,
                    help="with --trace: seconds between the controller's rate changes")
    ap.add_argument("--trace-offset", type=float, default=None,
                    help="with --trace: start this many seconds into the trace (default: seeded by --seed)")
    flags.SEED.add_to(ap, help="with --trace: the seed of the trace's start offset")
    ap.add_argument("--trace-log", default=None, help="with --trace: write every applied rate to this CSV")
    _target(ap)
    cl = sub.add_parser("clear", help="remove everything apply added (no-op on a clean interface)")
    flags.DRY_RUN.add_to(cl, help="print the commands, change nothing")
    _target(cl)
    sh = sub.add_parser("show", help="the qdiscs as the kernel reports them")
    sh.add_argument("--json", action="store_true")
    _target(sh)
    me = sub.add_parser("measure", help="RTT and goodput to a 'serve' peer, written as JSON")
    flags.HOST.add_to(me, required=True, help="the serve peer's address")
    flags.PORT.add_to(me, default=5201, help="the serve peer's port")
    me.add_argument("--samples", type=positive_int, default=20, help="TCP round trips for the RTT")
    me.add_argument("--bytes", type=positive_int, default=2_000_000, help="bytes per bulk transfer, each way")
    flags.OUT.add_to(me, help="JSON file (printed when not given)")
    se = sub.add_parser("serve", help="answer measure clients until Ctrl-C")
    flags.HOST.add_to(se, default="0.0.0.0", help="address to listen on")
    flags.PORT.add_to(se, default=5201, help="port to listen on")
    se.add_argument("--max-clients", type=positive_int, default=64, help="connections served at once")
    _relay_parser(sub)
    sub.add_parser("networks", aliases=["profiles"], help="list the named network conditions")
    for p in {id(p): p for p in sub.choices.values()}.values():
        add_common_flags(p)
    return top


def main(argv: Sequence[str] | None = None, prog: str = "network_delay.py") -> int:
    args = parser(prog).parse_args(argv)
    setup_logging(args.debug, args.quiet)
    if args.cmd in ("networks", "profiles"):
        for cond in load_conditions().values():
            print(f"{cond.describe():<60} {cond.comment}")
        return 0
    if args.cmd == "serve":
        print(f"serving measure clients on {args.host}:{args.port} (Ctrl-C to stop)", flush=True)
        probe.serve(args.host, args.port, args.max_clients)
        return 0
    if args.cmd == "measure":
        result = probe.measure(args.host, args.port, args.samples, args.bytes)
        if args.out:
            records.atomic_write_json(args.out, result)
        print(json.dumps(result, indent=1))
        return 0
    if args.cmd == "relay":
        return _relay(args)
    runner = tc.Runner(args.ssh, args.ssh_key, args.sudo, args.netns)
    if args.cmd == "show":
        qdiscs = tc.show(args.dev, runner)
        print(json.dumps(qdiscs, indent=1) if args.json else tc.format_show(qdiscs))
        return 0
    if args.cmd == "clear":
        if args.dry_run:
            print("\n".join(map(str, tctree.clear_commands(args.dev))))
            return 0
        tc.clear(args.dev, runner=runner)
        print(f"cleared {args.dev}")
        return 0
    conditions = network_from_args(args, required=True)
    # This host's egress carries the up direction; with --ingress, its ingress the down direction.
    direction = conditions.up
    ingress = conditions.down if args.ingress else False
    if args.dry_run:
        print(f"# {conditions.describe()}")
        print("\n".join(map(str, tctree.apply_commands(direction, args.dev, ingress, args.port))))
        return 0
    traced = direction.trace or (ingress and ingress.trace)
    if traced and args.duration is None and not args.dry_run:
        raise UsageError("a trace changes the rate while it is applied: give --duration SECONDS")
    if args.duration is None:
        tc.apply(direction, args.dev, ingress, args.port, runner)
        print(f"applied {conditions.describe()} on {args.dev}; now on the link:")
        print(tc.format_show(tc.show(args.dev, runner)))
        print(f"remove with: network_delay.py clear --dev {args.dev}")
        return 0
    return _hold(args, conditions, direction, ingress, runner)


def _hold(args: argparse.Namespace, conditions: Any, direction: Direction, ingress: Any, runner: Any) -> int:
    """Apply the conditions for ``--duration`` seconds (a trace followed by its controllers), then clear."""
    log_path = None if args.trace_log is None else Path(args.trace_log)
    with tc.applied(direction, args.dev, ingress, args.port, runner) as held, \
            tracecontrol.following(direction, args.dev, runner, args.trace_offset, args.seed, "up",
                                   args.trace_interval, log_path) as up, \
            tracecontrol.following(ingress or Direction(), tctree.ifb_name(args.dev), runner, args.trace_offset,
                                   args.seed, "down", args.trace_interval,
                                   None if log_path is None else log_path.with_suffix(".down.csv")) as down:
        print(f"applied {conditions.describe()} on {args.dev} for {args.duration:g}s (Ctrl-C clears it early)", flush=True)
        held.hold(args.duration)
    for ctl in (up, down):
        if ctl is not None:
            s = ctl.summary()
            print(f"trace {s['trace']['trace']} on {s['dev']}: {s['steps']} rate changes every {s['interval_s']:g}s "
                  f"from offset {s['offset_s']:g}s, median {1e3 * (s['late_median_s'] or 0):.1f} ms late"
                  + (f"; stopped early: {s['error']}" if s['error'] else ""))
    print(f"cleared {args.dev}")
    return 0


def _relay(args: argparse.Namespace) -> int:
    """Forward to ``--to`` through the conditions' two directions until the duration or a signal."""
    from ..network.relay import LinkRelay  # lazy: the other subcommands need no relay

    host, port = host_port(args.to, f"--to {args.to!r}", "127.0.0.1:50052")
    try:
        ipaddress.ip_address(host)
    except ValueError:
        raise UsageError(f"--to {args.to!r}: give a numeric address, e.g. 127.0.0.1:50052 (a name would be "
                         f"looked up)") from None
    conditions = network_from_args(args)
    up, down = (conditions.up, conditions.down) if conditions else (None, None)
    relay = LinkRelay((host, port), up, down, (args.host, args.port), args.seed)
    try:
        relay.start()
    except OSError as exc:
        raise UsageError(f"--host {args.host} --port {args.port}: cannot listen there ({exc.strerror})") from None
    what = conditions.describe() if conditions else "an unshaped link"
    log.info("relaying %s:%d -> %s over %s (Ctrl-C to stop)", args.host, args.port, args.to, what)
    signals_as_interrupt()
    try:
        threading.Event().wait(args.duration)
    except KeyboardInterrupt:
        pass
    finally:
        relay.close()
        counts = relay.counts().to_dict()
        if args.out:
            records.atomic_write_json(args.out, {"to": args.to, "conditions": what, **counts})
        print("relayed " + ", ".join(f"{k} {v}" for k, v in counts.items()), flush=True)
    return 0
