"""A stateful fuzzer: hypothesis drives fake peers that speak the protocol and mutate every message,
in every state, against real stage-worker processes. After every case the worker is alive and a
real peer completes a correct run with it.

- a stranger (no secret) against a stage-1 worker's listener, mutating the handshake;
- an authenticated but hostile stage 2, mutating RUN_OK, the results and its RECORDS;
- a hostile stage 1 against a stage-2 worker, mutating CHALLENGE, HELLO_OK, RUN, the tensors and RECORDS.

This module attacks the TCP port; ``test_fuzz_transports.py`` runs the same attackers (in
``fuzz_helpers``) over WebSocket, MQTT and HTTP.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings, strategies as st

from fuzz_helpers import (SETTINGS, hostile_stage1_then_the_real_one, hostile_stage2_then_the_real_one,
                          real_stage1_run, stage1_worker, stage2_worker, stranger_then_the_real_one)


# -- a stage-1 worker and the real stage 2 -----------------------------------------------------------
@pytest.fixture(scope="module")
def stage1():
    yield from stage1_worker("none")


@pytest.fixture(scope="module")
def sealed_stage1():
    """A stage-1 worker whose data port seals every frame after the handshake (AES-GCM)."""
    yield from stage1_worker("aesgcm")


@pytest.mark.slow
@SETTINGS
@given(data=st.data())
def test_strangers_mutating_the_handshake(stage1, data):
    stranger_then_the_real_one(*stage1, data)


@pytest.mark.slow
@SETTINGS
@given(data=st.data())
def test_an_authenticated_stage2_misbehaving_in_every_state(stage1, data):
    hostile_stage2_then_the_real_one(*stage1, data, "none")


@pytest.mark.slow
@settings(SETTINGS, max_examples=9)
@given(data=st.data())
def test_an_authenticated_stage2_misbehaving_on_the_sealed_port(sealed_stage1, data):
    """The same hostile peer against a stage 1 whose port is sealed: its sealed mutations and its
    unsealed garbage each end that run cleanly, and the real (sealing) stage 2 is served next."""
    hostile_stage2_then_the_real_one(*sealed_stage1, data, "aesgcm")


# -- a stage-2 worker and hostile stage 1s ---------------------------------------------------------
@pytest.fixture(scope="module")
def stage2():
    yield from stage2_worker()


@pytest.mark.slow
@SETTINGS
@given(data=st.data())
def test_a_hostile_stage1_mutating_every_state(stage2, data):
    hostile_stage1_then_the_real_one(stage2, data)


def test_stage2_serves_the_next_connection_as_soon_as_it_says_the_last_one_ended(stage2):
    """A controller connects again the moment it reads "connection_ended". The worker once emitted that
    line before its serve thread had finished, and under load it refused the next connect with
    "already serving a connection" (seen in CI); now the flag is cleared before the line is written."""
    for _ in range(6):
        real_stage1_run(stage2)
