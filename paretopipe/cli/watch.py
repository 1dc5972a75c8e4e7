"""``paretopipe watch SESSION``: a live page of a session, running or done (analysis/live_server.py)."""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path
from typing import Sequence

from ..errors import UsageError
from ..options import flags
from .common import (ArgumentParser, HelpFormatter, add_common_flags, example_epilog, port_or_zero, setup_logging,
                     signals_as_interrupt)

TOKEN_ENV = "PARETOPIPE_WATCH_TOKEN"


def parser(prog: str = "paretopipe watch") -> ArgumentParser:
    p = ArgumentParser(prog=prog, formatter_class=HelpFormatter,
                       description="Serve a page that follows a sweep session as it is written: progress and ETA, "
                                   "the front forming per network with its intervals, the newest run's batch "
                                   "latencies, the adaptive split's choices and re-profiles, drift alerts. GET "
                                   "/api/session returns the same as JSON.",
                       epilog=example_epilog("paretopipe watch results/20261126-170000",
                                             "paretopipe watch results --port 9000",
                                             f"paretopipe watch results --host 0.0.0.0 --token \"${TOKEN_ENV}\""))
    p.add_argument("session", help="a session folder, or a results folder (its newest session)")
    flags.PORT.add_to(p, type=port_or_zero, default=8765, help="port to serve on (0: any free one)")
    flags.HOST.add_to(p, default="127.0.0.1", help="address to bind (numeric); anything but loopback needs --token")
    p.add_argument("--token", default=None,
                   help=f"a secret every request must carry (?token=...), needed off loopback; default ${TOKEN_ENV}")
    add_common_flags(p)
    return p


def session_folder(path: str) -> Path:
    """The session itself, or the newest session under a results folder."""
    # lazy for start-up: pandas
    from ..analysis.session import sessions_under

    folder = Path(path).expanduser()
    if not folder.is_dir():
        raise UsageError(f"{folder} is not a folder; give a session folder (results/<session>) or a results folder")
    if (folder / "session.json").is_file() or (folder / "runs").is_dir():
        return folder
    found = sessions_under(folder, "session.json")
    if not found:
        raise UsageError(f"no session under {folder} (a session folder holds session.json and runs/)")
    return found[-1]


def main(argv: Sequence[str] | None = None, prog: str = "paretopipe watch") -> int:
    args = parser(prog).parse_args(argv)
    setup_logging(args.debug, args.quiet)
    signals_as_interrupt()
    # lazy for start-up: pandas
    from ..analysis.live_server import WatchServer

    server = WatchServer(session_folder(args.session), args.host, args.port, args.token or os.environ.get(TOKEN_ENV))
    print(f"watching {server.live.session.path} at {server.url} (Ctrl-C to stop)", file=sys.stderr, flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        logging.getLogger("paretopipe.watch").info("stopped")
    finally:
        server.server_close()
    return 0
