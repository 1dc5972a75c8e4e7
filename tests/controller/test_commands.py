"""The sweeper's command protocol, as every stage process and RPC rank 0 reads it."""

from __future__ import annotations

import dataclasses
import json

from paretopipe.controller.commands import serve_commands


@dataclasses.dataclass
class Ping:
    cmd: str
    n: int


def _serve(capsys, lines: list[str]) -> tuple[bool, list, list[dict]]:
    got: list = []
    quit_seen = serve_commands({"ping": Ping}, got.append, "stage9", lines)
    events = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    return quit_seen, got, events


def test_checked_commands_are_handled_in_order_and_junk_is_refused_by_name(capsys):
    quit_seen, got, events = _serve(capsys, [
        '{"cmd": "ping", "n": 1}', "", "not json {", '["cmd", "ping"]', '{"cmd": "exec", "code": "1"}',
        '{"cmd": "ping", "n": "2"}', '{"cmd": "ping", "n": 2, "extra": true}', '[' * 100_000,
        '{"cmd": "ping", "n": 3}', '{"cmd": "quit"}', '{"cmd": "ping", "n": 4}'])
    assert quit_seen and got == [Ping("ping", 1), Ping("ping", 3)]  # nothing after quit
    errors = [e["error"] for e in events]
    assert all(e["event"] == "error" for e in events) and len(errors) == 6
    assert errors[0] == "command is not JSON" and errors[1] == "a command must be a JSON object"
    assert errors[2] == "stage9 does not understand 'exec' (it takes ping and quit)"
    assert "n" in errors[3] and "extra" in errors[4] and errors[5] == "command is not JSON"


def test_a_failing_command_is_an_error_event_and_the_next_one_is_served(capsys):
    from paretopipe.errors import PeerError

    served = []

    def handle(cmd: Ping) -> None:
        if cmd.n == 1:
            raise PeerError("stage 2 went away")
        served.append(cmd.n)

    assert not serve_commands({"ping": Ping}, handle, "stage1", ['{"cmd": "ping", "n": 1}', '{"cmd": "ping", "n": 2}'])
    assert [json.loads(x) for x in capsys.readouterr().out.splitlines()] == [
        {"event": "error", "error": "stage 2 went away"}]
    assert served == [2]
