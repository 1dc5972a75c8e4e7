"""The encrypted data port, end to end over real sockets: outputs equal the unsplit model's under
each cipher, the activation's bytes never cross the wire in the clear, and a frame flipped,
replayed, reordered or cut short on the way ends the run with one line while the listener goes on
serving the real peer."""

from __future__ import annotations

import contextlib
import socket
import threading

import pytest
import torch

from paretopipe.errors import ParetoPipeError, PeerError, UsageError, WireError
from paretopipe.partition import models
from paretopipe.transport import aead, inputs, tcp, wire
from paretopipe.transport.runconfig import RunConfig
from tcp_helpers import builder, run_in_threads

SECRET = b"sealed-port-secret-0123456789"
MODEL = "resnet18"
SPLIT = 5
TAG = 16


def _reference(batch: int, count: int) -> list[torch.Tensor]:
    model = builder(MODEL).model
    with torch.no_grad():
        return [model(x) for x in inputs.batches("synthetic", batch, models.input_size(MODEL), count, seed=0)]


@pytest.mark.parametrize("cipher", ["chacha20", "aesgcm", "auto"])
def test_each_cipher_gives_the_unsplit_models_outputs_and_records_its_cost(cipher, tmp_path):
    s1, s2 = run_in_threads(MODEL, SPLIT, tmp_path, secret=SECRET, encrypt=cipher, batch_size=2, num_batches=2,
                            warmup=1, in_flight=2)
    for got, want in zip(s1.outputs, _reference(2, 3), strict=True):
        assert torch.allclose(got, want, atol=1e-5, rtol=0)
    used = {st["cipher"]["cipher"] for st in s1.record["manifest"]["stages"]}
    aes = aead.has_aes_instructions()
    assert used == {aead.resolve(cipher, aes, cipher, aes)}
    assert used == {cipher} if cipher != "auto" else used == {"aesgcm" if aes else "chacha20"}
    for outcome in (s1, s2):
        assert outcome.record["status"] == "complete"
        for b in outcome.record["batches"]:
            # every frame of the batch was sealed on one stage and opened on the other, and timed
            assert all(b[k] > 0 for k in ("stage1_seal_s", "stage2_open_s", "stage2_seal_s", "result_open_s")), b
    usage = {st["role"]: st["cipher"] for st in s1.record["manifest"]["stages"]}
    # Each side counts from RUN to the moment it writes its part: stage 1 sealed RUN and 3 TENSORs and
    # opened RUN_OK and 3 RESULTs; stage 2 opened RUN, 3 TENSORs and stage 1's RECORDS, and sealed
    # RUN_OK and 3 RESULTs.
    assert (usage["stage1"]["frames_sealed"], usage["stage1"]["frames_opened"]) == (4, 4)
    assert (usage["stage2"]["frames_sealed"], usage["stage2"]["frames_opened"]) == (4, 5)
    assert all(u["seal_s"] > 0 and u["open_s"] > 0 for u in usage.values())
    assert s1.record["summary"]["stage1_seal_median_s"] > 0


def test_a_plain_run_records_no_cipher(tmp_path):
    s1, _ = run_in_threads(MODEL, SPLIT, tmp_path, secret=SECRET, batch_size=1, num_batches=1, warmup=0)
    assert [st["cipher"] for st in s1.record["manifest"]["stages"]] == [{"cipher": "none"}] * 2
    assert not any("seal" in k or "open" in k for k in s1.record["batches"][0])


# -- a relay between stage 2 and the listener ---------------------------------------------------------
class Relay:
    """Forwards stage 2 <-> stage 1 and cuts stage 1's byte stream into frames (the first two, the
    handshake's, travel plain; on a ``sealed`` connection every later one carries a tag). ``attack``
    may rewrite the list of frames after RUN (the TENSORs) once it holds ``needs`` of them, and
    ``cut`` then ends the stream there; the bytes are recorded as they arrive. When either side
    hangs up, or the relay cannot parse a frame, both sockets are shut down, so no peer waits on it."""

    def __init__(self, port: int, attack=None, needs: int = 0, cut: bool = False, sealed: bool = True) -> None:
        self.srv = socket.create_server(("127.0.0.1", 0))
        self.port = self.srv.getsockname()[1]
        self.upstream_port, self.attack, self.needs, self.cut = port, attack, needs, cut
        self.tag = TAG if sealed else 0
        self.seen = bytearray()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        down, _ = self.srv.accept()
        up = socket.create_connection(("127.0.0.1", self.upstream_port))
        threading.Thread(target=self._pipe, args=(down, up), daemon=True).start()
        try:
            self._frames(up, down)
        except (OSError, WireError):
            pass
        finally:
            for s in (up, down):
                # close() alone would not wake the pipe thread's recv, nor send the peer its FIN
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)
                s.close()
            self.srv.close()

    @staticmethod
    def _pipe(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(1 << 16):
                dst.sendall(data)
        except OSError:  # a reset: stage 2 closed with frames it had not read
            pass
        finally:
            with contextlib.suppress(OSError):
                dst.shutdown(socket.SHUT_WR)  # stage 2 hung up: so does the relay, towards stage 1

    def _read(self, sock: socket.socket, n: int) -> bytes:
        out = bytearray()
        while len(out) < n:
            chunk = sock.recv(n - len(out))
            if not chunk:
                raise OSError("closed")
            out += chunk
        self.seen += out
        return bytes(out)

    def _frames(self, up: socket.socket, down: socket.socket) -> None:
        held: list[bytes] = []
        count = 0
        while True:
            head = self._read(up, wire.HEADER.size)
            h = wire.parse_header(head)
            body = self._read(up, h.meta_len + h.nbytes + (self.tag if count >= 2 else 0))
            count += 1
            if count <= 3 or self.attack is None:  # CHALLENGE, HELLO_OK, RUN
                down.sendall(head + body)
                continue
            held.append(head + body)
            if len(held) == self.needs:
                for f in self.attack(held):
                    down.sendall(f)
                if self.cut:
                    down.shutdown(socket.SHUT_WR)  # the rest never comes
                self.attack = None


def _flip_body(frames):
    f = bytearray(frames[0])
    f[wire.HEADER.size + 1000] ^= 0x01
    return [bytes(f)]


def _flip_header_seq(frames):
    f = bytearray(frames[0])
    f[wire.SEQ_OFFSET] ^= 0x01  # batch 0 relabelled batch 1: a header field parse_header never checks
    return [bytes(f)]


ATTACKS = {  # what the relay does to the sealed frames TENSOR 0, TENSOR 1
    "flipped body bit": (_flip_body, 1),
    "flipped header bit": (_flip_header_seq, 1),
    "replayed frame": (lambda fs: fs + [fs[0]], 1),                 # TENSOR 0 twice
    "reordered frames": (lambda fs: [fs[1], fs[0]], 2),             # TENSOR 1 before TENSOR 0
    "truncated frame": (lambda fs: [fs[0][:-100]], 1),              # TENSOR 0 cut short, then the end
}


def _stage1_in_thread(listener, cfg, out):
    def stage1():
        try:
            out["s1"] = tcp.run_stage1(listener, builder(MODEL), cfg, connect_timeout=30)
        except BaseException as exc:
            out["s1_error"] = exc
    th = threading.Thread(target=stage1)
    th.start()
    return th


def _cfg(num_batches: int = 2) -> RunConfig:
    b = builder(MODEL)
    return RunConfig(model=b.name, cuts=b.cuts_for(SPLIT), split_index=SPLIT, batch_size=1, num_batches=num_batches,
                     warmup=0, in_flight=2, timeout_s=20)


@pytest.mark.parametrize("attack", list(ATTACKS))
def test_a_frame_altered_on_the_way_ends_the_run_in_one_line_and_the_real_peer_is_served(attack, tmp_path):
    b = builder(MODEL)
    listener = tcp.StageListener(tcp.listen("127.0.0.1", 0), tcp.identity_of(b), SECRET, encrypt="aesgcm")
    try:
        fn, needs = ATTACKS[attack]
        relay = Relay(listener.port, fn, needs, cut=attack == "truncated frame")
        out: dict = {}
        th = _stage1_in_thread(listener, _cfg(), out)
        connection = tcp.open_connection(socket.create_connection(("127.0.0.1", relay.port)), b,
                                         cuts=b.cuts_for(SPLIT), secret=SECRET, encrypt="aesgcm")
        with pytest.raises((WireError, PeerError)) as caught:
            tcp.serve_connection(connection, b, timeout_s=20)
        th.join(60)
        message = str(caught.value)
        assert "\n" not in message
        if attack == "truncated frame":
            assert "in the middle of a frame body" in message
        else:
            assert "failed authentication" in message and "replayed, reordered" in message
        assert isinstance(out.get("s1_error"), ParetoPipeError) and "\n" not in str(out["s1_error"])
        # The listener survived: the real peer, connected directly, completes a run.
        out = {}
        th = _stage1_in_thread(listener, _cfg(1), out)
        direct = tcp.open_connection(socket.create_connection(("127.0.0.1", listener.port)), b,
                                     cuts=b.cuts_for(SPLIT), secret=SECRET, encrypt="aesgcm")
        (served,) = tcp.serve_connection(direct, b, timeout_s=20)
        th.join(60)
        assert served.record["status"] == out["s1"].record["status"] == "complete"
    finally:
        listener.close()


@pytest.mark.parametrize("cipher", ["none", "chacha20"])
def test_the_wire_never_carries_the_activation_in_the_clear(cipher):
    """The first batch's activation is computed here; its bytes are searched for in everything stage 1
    sent. The plain run proves the search finds them; the sealed run must not contain them."""
    b = builder(MODEL)
    x = next(inputs.batches("synthetic", 1, models.input_size(MODEL), 1, seed=0))
    with torch.no_grad():
        activation = b.stage(b.cuts_for(SPLIT), 0)(x).contiguous()
    needle = activation.numpy().tobytes()[4096:4096 + 64]
    listener = tcp.StageListener(tcp.listen("127.0.0.1", 0), tcp.identity_of(b), SECRET, encrypt=cipher)
    try:
        relay = Relay(listener.port, sealed=cipher != "none")
        out: dict = {}
        th = _stage1_in_thread(listener, _cfg(1), out)
        connection = tcp.open_connection(socket.create_connection(("127.0.0.1", relay.port)), b,
                                         cuts=b.cuts_for(SPLIT), secret=SECRET, encrypt=cipher)
        tcp.serve_connection(connection, b, timeout_s=20)
        th.join(60)
        relay.thread.join(10)
        assert out["s1"].record["status"] == "complete"
        assert len(relay.seen) > activation.nbytes
        assert (needle in relay.seen) == (cipher == "none")
    finally:
        listener.close()


def test_the_two_ends_must_agree_on_the_cipher():
    b = builder(MODEL)
    cases = [("chacha20", "aesgcm", "encryption mismatch: stage 1 has --encrypt chacha20, stage 2 has --encrypt aesgcm"),
             ("none", "aesgcm", "encryption mismatch: stage 1 has --encrypt none"),
             ("aesgcm", "none", "encryption mismatch: stage 1 has --encrypt aesgcm, stage 2 has --encrypt none")]
    for first, second, why in cases:
        listener = tcp.StageListener(tcp.listen("127.0.0.1", 0), tcp.identity_of(b), SECRET, encrypt=first,
                                     handshake_timeout=2)
        try:
            with pytest.raises(PeerError, match=why):
                tcp.open_connection(socket.create_connection(("127.0.0.1", listener.port)), b, secret=SECRET,
                                    encrypt=second)
        finally:
            listener.close()


def test_encryption_without_a_shared_secret_is_refused_in_one_line():
    b = builder(MODEL)
    with pytest.raises(UsageError, match="--encrypt aesgcm needs PARETOPIPE_SECRET"):
        tcp.StageListener(tcp.listen("127.0.0.1", 0), tcp.identity_of(b), None, encrypt="aesgcm")
    with pytest.raises(UsageError, match="--encrypt auto needs PARETOPIPE_SECRET"):
        tcp.open_connection(socket.socket(), b, secret=None, encrypt="auto")
