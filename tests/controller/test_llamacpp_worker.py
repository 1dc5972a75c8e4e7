"""The worker that runs llama.cpp's client side, without llama.cpp: its command line refused where
it names no server, and checked against where llama-server says it put the layers. Its runs with
llama.cpp are tests/peers; how a run's steps take the relays' counts is tests/llm/test_llamacpp_steps.py."""

from __future__ import annotations

import pytest

from paretopipe.errors import UsageError
from paretopipe.llm import llamacpp
from paretopipe.errors import PeerError
from paretopipe.controller.llamacpp_worker import ClientSide, PeerOptions


def test_a_client_without_a_servers_address_is_refused_in_one_line(monkeypatch):
    side = ClientSide.__new__(ClientSide)  # the address is checked before anything starts
    side.opts = PeerOptions(side="client", model="smollm2-135m-instruct", rpc="no-port")
    with pytest.raises(UsageError, match=r"--rpc 'no-port': give HOST:PORT"):
        side.start()


def test_the_workers_command_line_round_trips():
    opts = PeerOptions(side="server", model="smollm2-135m-instruct", threads=1, cpus="1", host="0.0.0.0", port=5555)
    assert PeerOptions.parse(opts.to_argv(), "w", "d") == opts


def test_a_llama_server_that_put_the_layers_elsewhere_fails_the_run_naming_both():
    """Stage 1 checks llama-server's own account (its log, llm.llamacpp.loaded_layers) against the
    plan before any token: a record must say what ran."""
    from paretopipe.network.relay import LinkRelay

    side = ClientSide.__new__(ClientSide)
    side.relays = [LinkRelay(("127.0.0.1", 9)), LinkRelay(("127.0.0.1", 9))]
    try:
        a, b = (f"127.0.0.1:{relay.start()}" for relay in side.relays)
        placed = llamacpp.offload([10, 20], 30)
        side.loaded = {"layers": {"CPU": 9, a: 10, b: 11}, "output_offloaded": True}
        side._check_loaded(placed)  # the plan's
        side.loaded = {"layers": {"CPU": 10, a: 9, b: 11}, "output_offloaded": True}
        with pytest.raises(PeerError, match=r"llama-server placed layers .*'CPU': 10.* not the plan's .*'CPU': 9"):
            side._check_loaded(placed)
        side.loaded = None  # another version's log, which does not say: nothing to check against
        side._check_loaded(placed)
    finally:
        for relay in side.relays:
            relay.close()
