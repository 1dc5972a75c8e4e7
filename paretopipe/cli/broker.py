"""``paretopipe broker``: a Mosquitto broker in the foreground, for stages run by hand over MQTT.
It prints each stage's ``.env`` lines (its user and password) and runs until Ctrl-C."""

from __future__ import annotations

from typing import Sequence

from ..options import flags
from ..transport.messaging.broker import Broker
from .common import ArgumentParser, HelpFormatter, add_common_flags, example_epilog, setup_logging

DEFAULT_MQTT_PORT = 1883


def parser(prog: str = "paretopipe broker") -> ArgumentParser:
    p = ArgumentParser(prog=prog, formatter_class=HelpFormatter,
                       description="Start a Mosquitto broker with one user per stage (anonymous clients refused; each "
                                   "user may use its run's namespace only) and print each stage's .env lines.",
                       epilog=example_epilog("paretopipe broker --host 127.0.0.1 --port 1883 --stages 2"))
    flags.HOST.add_to(p, default="127.0.0.1", help="address the broker listens on (numeric)")
    flags.PORT.add_to(p, default=DEFAULT_MQTT_PORT, help="port the broker listens on")
    flags.STAGES.add_to(p, help="stages of the pipeline: one broker user each")
    add_common_flags(p)
    return p


def main(argv: Sequence[str] | None = None, prog: str = "paretopipe broker") -> int:
    args = parser(prog).parse_args(argv)
    setup_logging(args.debug, args.quiet)
    with Broker(args.host, args.port, [f"stage{i}" for i in range(1, args.stages + 1)]) as broker:
        for user in broker.passwords:
            print(f"# .env of {user}\n{broker.env_lines(user)}")
        print("broker running; Ctrl-C stops it", flush=True)
        try:
            broker.process.wait()
        except KeyboardInterrupt:
            pass
    return 0
