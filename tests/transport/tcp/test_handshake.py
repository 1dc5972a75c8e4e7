"""Both halves of the TCP handshake (transport.tcp.handshake) over real loopback sockets: a stranger,
a stage 2 of another split and one without the shared secret are each refused with the reason,
and the listener still hands the legitimate stage 2 its connection afterwards."""

from __future__ import annotations

import socket

import pytest

from paretopipe.errors import PeerError
from paretopipe.transport.tcp import StageListener, identity_of
from paretopipe.transport.tcp.handshake import open_connection
from tcp_helpers import builder

SECRET = b"a shared secret of the lab, 32 b"


def _listener(secret: bytes | None = None, cuts: list[str] | None = None) -> StageListener:
    sock = socket.create_server(("127.0.0.1", 0))
    listener = StageListener(sock, identity_of(builder("mobilenetv2")), secret, handshake_timeout=5)
    listener.expected_cuts = cuts
    return listener


def _stage2(listener: StageListener, **kw):
    return open_connection(socket.create_connection(("127.0.0.1", listener.port)), builder("mobilenetv2"),
                           timeout=5, **kw)


def test_a_stranger_is_refused_and_the_real_stage_2_still_connects():
    listener = _listener(cuts=["features.6"])
    try:
        with socket.create_connection(("127.0.0.1", listener.port)) as stranger:
            stranger.sendall(b"GET / HTTP/1.0\r\n\r\n" + bytes(128))
            stranger.recv(4096)  # the challenge; the stranger's answer is not a HELLO
            try:  # and stage 1 hangs up on it (a reset: the stranger's bytes were left unread)
                hung_up = stranger.recv(4096) == b""
            except ConnectionResetError:
                hung_up = True
            assert hung_up
        peer = _stage2(listener, cuts=["features.6"])
        connection = listener.connection(5)
        assert connection.peer.model == "mobilenet_v2" and connection.cipher == "none"
        assert any("bad magic b'GET '" in why for why in listener.refusals), listener.refusals
        peer.close()
    finally:
        listener.close()


def test_a_stage_2_of_another_split_is_told_which_cuts_differ():
    listener = _listener(cuts=["features.6"])
    try:
        with pytest.raises(PeerError, match=r"handshake mismatch: cuts: stage 1 has \['features.6'\], stage 2 has "
                                             r"\['features.9'\]"):
            _stage2(listener, cuts=["features.9"])
        with pytest.raises(PeerError, match="no valid stage 2 connected within 0.2s .*handshake mismatch"):
            listener.connection(0.2)
    finally:
        listener.close()


def test_the_shared_secret_is_proven_both_ways():
    listener = _listener(secret=SECRET)
    try:
        with pytest.raises(PeerError, match="authentication required"):
            _stage2(listener)
        with pytest.raises(PeerError, match="authentication failed: stage 2 does not know the shared secret"):
            _stage2(listener, secret=b"another secret of the same size!")
        peer = _stage2(listener, secret=SECRET)
        assert listener.connection(5).peer.mac is not None
        peer.close()
    finally:
        listener.close()
    plain = _listener()
    try:  # a stage 2 with a secret sends no data to a stage 1 that cannot prove it has it
        with pytest.raises(PeerError, match="does not authenticate"):
            _stage2(plain, secret=SECRET)
    finally:
        plain.close()
