"""``paretopipe lab`` (and ``netem/lab.sh``): a lab of namespace hosts with their own sshd."""

from __future__ import annotations

import json
from typing import Sequence

from .common import ArgumentParser, HelpFormatter, add_common_flags, example_epilog, positive_int, setup_logging
from ..compute import cpushare
from ..controller import lab


def parser(prog: str = "paretopipe lab") -> ArgumentParser:
    top = ArgumentParser(
        prog=prog, formatter_class=HelpFormatter,
        description="A lab of N hosts on this machine: network namespaces on a bridge, each with an address, an "
                    "eth0 and its own key-only sshd. 'up' writes a .env that points the sweeper at them as a "
                    "user's .env points at Pis; 'down' removes everything. Needs root.",
        epilog=example_epilog("sudo paretopipe lab up --hosts 2",
                              "sudo paretopipe sweep --env-file /tmp/paretopipe-lab-pplab/lab.env --model mobilenetv2 "
                              "--network lan --link tc",
                              "sudo paretopipe lab down"))
    sub = top.add_subparsers(dest="cmd", required=True, parser_class=ArgumentParser)
    up = sub.add_parser("up", help="create the lab (replacing one of the same name)", formatter_class=HelpFormatter)
    up.add_argument("--hosts", type=positive_int, default=2, help="how many hosts (2..8)")
    up.add_argument("--subnet", type=int, default=0, help="S in 10.77.S.0/24")
    up.add_argument("--env", default=None, help="also write the lab's .env here (it is always in the lab's folder)")
    up.add_argument("--remote-dir", default=None,
                    help="REMOTE_DIR of the .env: where the hosts run from, so where a model file's relative "
                         "path resolves (the hosts share this machine's files: '.' is this folder); where this "
                         "package is, if not given")
    up.add_argument("--arch", default="", help="each host's architecture, comma-separated: native or aarch64 (a "
                                              "Pi's core under qemu-user in the sysroot `make lab-arm` builds); "
                                              "hosts not named are native")
    up.add_argument("--broker", type=positive_int, default=None, metavar="I",
                    help="run a Mosquitto broker on host I's address (port 1883) for --transport mqtt; its "
                         "MQTT_* lines go into the lab's .env")
    up.add_argument("--host-cpu", default=None, metavar="SHARES",
                    help="each host's CPU share, comma-separated (1 = one core; none: unlimited), e.g. 1,1,0.25: a "
                         "cgroup around the host's sshd holds every process started there over SSH, so that host "
                         "is a slower device (its network threads wait out the quota too, as the stage's do not "
                         "on a real one)")
    for p in (up, sub.add_parser("down", help="remove the lab"), sub.add_parser("status", help="what is up")):
        p.add_argument("--name", default="pplab", help="lab name (1-8 lowercase letters and digits)")
        add_common_flags(p)
    return top


def main(argv: Sequence[str] | None = None, prog: str = "paretopipe lab") -> int:
    args = parser(prog).parse_args(argv)
    setup_logging(args.debug, args.quiet)
    if args.cmd == "up":
        arches = [a.strip() for a in args.arch.split(",") if a.strip()]
        cpu = cpushare.parse_shares(args.host_cpu, args.hosts, "--host-cpu", "host") if args.host_cpu else None
        made = lab.up(args.name, args.hosts, args.subnet, args.env, args.remote_dir, arches=arches, broker=args.broker,
                      cpu=cpu)
        hosts = [a + "".join(f" ({w})" for w in (arch if arch != "native" else None,
                                                  None if share is None else f"{share:g} CPU") if w)
                 for a, arch, share in zip(made.addresses(), made.arches, made.cpu)]
        print(f"lab {made.name} up: {made.hosts} hosts {', '.join(hosts)} on bridge {made.bridge} "
              f"({made.gateway}); sshd on each" + (f"; MQTT broker on {made.address(made.broker_host)}:1883"
                                                       if made.broker_host else "") + f"; .env: {made.env_file}")
        return 0
    if args.cmd == "down":
        lab.require_root()
        removed = lab.down(args.name)
        print(f"lab {args.name} down" + (f": removed {', '.join(removed)}" if removed else " (nothing was up)"))
        return 0
    print(json.dumps(lab.status(args.name), indent=1))
    return 0
