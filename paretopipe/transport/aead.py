"""Sealed frames on the data port: every frame after the handshake is encrypted and authenticated
with an AEAD cipher, ChaCha20-Poly1305 or AES-256-GCM, from pyca ``cryptography``.

- **Keys.** HKDF-SHA256 over the shared secret, salted with both handshake nonces, gives one
  key per direction. A connection's keys are new every time, and nobody without the secret can
  derive them, so encryption needs ``PARETOPIPE_SECRET`` on both hosts.
- **Nonces** are a per-direction frame counter, never sent: a frame replayed, reordered or
  dropped on the way is opened under the wrong counter, so it fails authentication like a
  flipped bit does.
- **Associated data** is the frame's fixed header, which stays readable (it bounds what the
  receiver allocates) but cannot be altered: the body (meta and payload) is sealed under it.

A sealed frame is the header, the sealed body, and the 16-byte tag. Sealing writes into one
buffer per connection and opening works in place (``encrypt_into``/``decrypt_into``), so the
payload is copied once, by the cipher itself.
"""

from __future__ import annotations

import platform
import struct
import threading
import time
from pathlib import Path
from typing import Any

from ..errors import UsageError, WireError

CIPHERS = ("chacha20", "aesgcm")
CHOICES = ("none", "auto") + CIPHERS
TAG_BYTES = 16
KEY_BYTES = 32
_NONCE = struct.Struct(">4xQ")  # 12 bytes: four zero bytes, then the frame counter
_INFO = b"paretopipe data port v1 "


def check_choice(choice: str, secret: bytes | None, flag: str = "--encrypt") -> str:
    """A user's cipher choice; one that asks for encryption without a shared secret is refused."""
    if choice not in CHOICES:
        raise UsageError(f"{flag} {choice!r}: valid choices are {', '.join(CHOICES)}")
    if choice != "none" and secret is None:
        raise UsageError(f"{flag} {choice} needs PARETOPIPE_SECRET: the keys are derived from the shared secret; "
                         f"set the same one in .env on both hosts")
    return choice


def has_aes_instructions(cpuinfo: str | None = None, machine: str | None = None) -> bool:
    """Whether this CPU reports AES instructions (x86 ``aes`` flag, Arm ``aes`` feature). A Pi 4's
    Cortex-A72 (as Raspberry Pi OS ships it) reports none; a Pi 5, a Jetson and x86 servers do."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text(errors="replace")
        except OSError:
            cpuinfo = ""
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip().lower() in ("flags", "features") and "aes" in value.split():
            return True
    if not cpuinfo:  # no /proc (macOS): Apple silicon and every x86 Mac have AES instructions
        return (machine or platform.machine()).lower() in ("arm64", "x86_64", "amd64")
    return False


def resolve(stage1: str, stage1_aes: bool, stage2: str, stage2_aes: bool) -> str:
    """The cipher both ends use, computed alike on each: ``auto`` takes the other side's explicit
    choice, and two ``auto`` pick AES-GCM only when both CPUs have AES instructions (ChaCha20 is
    several times faster than table-based AES on a CPU without them). Raises on a mismatch."""
    for choice in (stage1, stage2):
        if choice not in CHOICES:
            raise WireError(f"unknown cipher choice {str(choice)[:40]!r}; valid: {', '.join(CHOICES)}")
    wanted = {c for c in (stage1, stage2) if c != "auto"}
    if "none" in wanted and (stage1, stage2) != ("none", "none"):
        raise WireError(f"encryption mismatch: stage 1 has --encrypt {stage1}, stage 2 has --encrypt {stage2}; "
                        f"give both the same")
    if len(wanted) > 1:
        raise WireError(f"encryption mismatch: stage 1 has --encrypt {stage1}, stage 2 has --encrypt {stage2}; "
                        f"give both the same (or auto on one)")
    if wanted:
        return wanted.pop()
    return "aesgcm" if stage1_aes and stage2_aes else "chacha20"


def derive_keys(secret: bytes, stage1_nonce: str, stage2_nonce: str, cipher: str) -> tuple[bytes, bytes]:
    """(stage 1 -> stage 2 key, stage 2 -> stage 1 key) for one connection."""
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.kdf.hkdf import HKDF

    salt = f"{stage1_nonce}|{stage2_nonce}".encode()
    okm = HKDF(algorithm=hashes.SHA256(), length=2 * KEY_BYTES, salt=salt,
               info=_INFO + cipher.encode()).derive(secret)
    return okm[:KEY_BYTES], okm[KEY_BYTES:]


def _aead(cipher: str, key: bytes) -> Any:
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM, ChaCha20Poly1305

    return (ChaCha20Poly1305 if cipher == "chacha20" else AESGCM)(key)


class Direction:
    """One direction of a connection: its cipher and key, the frame counter, and what sealing or
    opening has cost so far (the stages record it per batch and per run)."""

    def __init__(self, cipher: str, key: bytes) -> None:
        if cipher not in CIPHERS:
            raise UsageError(f"unknown cipher {cipher!r}; valid: {', '.join(CIPHERS)}")
        self.cipher = cipher
        self._aead = _aead(cipher, key)
        self.frames = 0
        self.seconds = 0.0
        self.last_s = 0.0
        self._lock = threading.Lock()
        self._out = bytearray()

    def _nonce(self) -> bytes:
        if self.frames >= 1 << 64:  # unreachable in practice; a reused nonce would break the cipher
            raise WireError("frame counter exhausted; reconnect")
        return _NONCE.pack(self.frames)

    def seal(self, header: bytes | bytearray, body: Any) -> memoryview:
        """The sealed body and tag for the next frame, in this direction's one output buffer: the
        caller sends it before sealing another (the sender holds :attr:`lock`)."""
        t0 = time.perf_counter()
        data = memoryview(body)
        if data.format != "B":  # a ctypes array over a tensor's memory reports "<B"
            data = data.cast("B")
        n = data.nbytes
        if len(self._out) != n + TAG_BYTES:
            self._out = bytearray(n + TAG_BYTES)
        self._aead.encrypt_into(self._nonce(), data, bytes(header), self._out)
        self.frames += 1
        self.last_s = time.perf_counter() - t0
        self.seconds += self.last_s
        return memoryview(self._out)

    @property
    def lock(self) -> threading.Lock:
        return self._lock

    def open_in_place(self, header: bytes, sealed: memoryview) -> None:
        """Check and decrypt ``sealed`` (body + tag) in place: the body is then ``sealed[:-16]``."""
        from cryptography.exceptions import InvalidTag

        t0 = time.perf_counter()
        try:
            self._aead.decrypt_into(self._nonce(), sealed, header, sealed[:sealed.nbytes - TAG_BYTES])
        except InvalidTag:
            raise WireError(f"frame {self.frames} after the handshake failed authentication: it was altered, "
                            f"replayed, reordered or cut short on the way")
        self.frames += 1
        self.last_s = time.perf_counter() - t0
        self.seconds += self.last_s


class Channel:
    """Both directions of one sealed connection."""

    def __init__(self, cipher: str, send_key: bytes, recv_key: bytes) -> None:
        self.cipher = cipher
        self.send = Direction(cipher, send_key)
        self.recv = Direction(cipher, recv_key)

    @classmethod
    def for_stage(cls, stage: int, cipher: str, secret: bytes, stage1_nonce: str, stage2_nonce: str) -> "Channel":
        one_to_two, two_to_one = derive_keys(secret, stage1_nonce, stage2_nonce, cipher)
        return cls(cipher, one_to_two, two_to_one) if stage == 1 else cls(cipher, two_to_one, one_to_two)

    def usage(self, since: dict[str, Any] | None = None) -> dict[str, Any]:
        """What sealing and opening cost on this side (frames, seconds): so far, or since an
        earlier :meth:`usage` (one run of the connection's many)."""
        now = {"cipher": self.cipher, "frames_sealed": self.send.frames, "seal_s": self.send.seconds,
               "frames_opened": self.recv.frames, "open_s": self.recv.seconds}
        if since:
            now.update({k: now[k] - since.get(k, 0) for k in ("frames_sealed", "seal_s", "frames_opened", "open_s")})
        return now


#: Frame sizes the profiler times sealing and opening at: a result's few bytes to a large activation.
PROFILE_SIZES = (1 << 10, 16 << 10, 256 << 10, 1 << 20, 4 << 20)


def time_cipher(cipher: str, sizes: tuple[int, ...] = PROFILE_SIZES, repetitions: int = 5) -> dict[str, Any]:
    """Seal and open time of one frame body per size on this CPU, through the data port's own
    :class:`Direction` (header as associated data, a counter nonce, one output buffer), fitted as
    ``fixed_s + bytes / bytes_per_s``: what the cost model adds per frame (a device profile's
    ``ciphers`` table). Medians of ``repetitions`` after one untimed pass per size."""
    key = bytes(range(KEY_BYTES))
    header = bytes(104)
    points = []
    for n in sizes:
        body = bytearray(n)
        sealer, opener = Direction(cipher, key), Direction(cipher, key)
        seal_s, open_s = [], []
        for rep in range(repetitions + 1):
            sealed = bytearray(sealer.seal(header, body))
            opener.open_in_place(header, memoryview(sealed))
            if rep:
                seal_s.append(sealer.last_s)
                open_s.append(opener.last_s)
        points.append((n, sorted(seal_s)[len(seal_s) // 2], sorted(open_s)[len(open_s) // 2]))
    return {"seal": _fit([(n, s) for n, s, _ in points]), "open": _fit([(n, o) for n, _, o in points]),
            "points": [{"bytes": n, "seal_s": s, "open_s": o} for n, s, o in points],
            "aes_instructions": has_aes_instructions()}


def _fit(points: list[tuple[int, float]]) -> dict[str, float | None]:
    """``t = fixed_s + n / bytes_per_s`` by least squares on relative errors (weights 1/t^2), so the
    1 KiB frame's few microseconds count as much as the 4 MiB frame's milliseconds; fixed at least
    0, and no rate from flat points."""
    w = [1.0 / max(t, 1e-9) ** 2 for _, t in points]
    sw = sum(w)
    mx = sum(wi * n for wi, (n, _) in zip(w, points)) / sw
    my = sum(wi * t for wi, (_, t) in zip(w, points)) / sw
    var = sum(wi * (n - mx) ** 2 for wi, (n, _) in zip(w, points))
    slope = sum(wi * (n - mx) * (t - my) for wi, (n, t) in zip(w, points)) / var if var else 0.0
    return {"fixed_s": max(0.0, my - slope * mx), "bytes_per_s": 1.0 / slope if slope > 0 else None}
