"""The data port's AEAD pieces on their own: the cipher both ends settle on, the CPU flags behind
``auto``, per-direction keys, counter nonces, and the per-frame timing the profiler fits.
(tests/transport/test_encrypted_port.py runs them end to end over real sockets.)"""

from __future__ import annotations

import pytest

from paretopipe.errors import UsageError, WireError
from paretopipe.transport import aead

SECRET = b"aead-unit-secret-0123456789abcdef"
# /proc/cpuinfo as each kind of host reports it (trimmed to the lines that matter).
PI4 = "processor\t: 0\nBogoMIPS\t: 108.00\nFeatures\t: fp asimd evtstrm crc32 cpuid\nCPU part\t: 0xd08\n"
PI5 = "processor\t: 0\nFeatures\t: fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid\n"
X86 = "processor\t: 0\nflags\t\t: fpu vme de pse tsc msr pae sse sse2 ssse3 sse4_1 sse4_2 aes avx avx2\n"
X86_OLD = "processor\t: 0\nflags\t\t: fpu vme de pse tsc msr pae sse sse2 ssse3\n"


def test_auto_picks_by_what_each_cpu_reports():
    assert [aead.has_aes_instructions(c) for c in (PI4, PI5, X86, X86_OLD)] == [False, True, True, False]
    # Both ends auto: AES-GCM only when both have AES instructions (a Pi 4 on either end: ChaCha20).
    assert aead.resolve("auto", True, "auto", True) == "aesgcm"
    assert aead.resolve("auto", False, "auto", True) == "chacha20"
    assert aead.resolve("auto", True, "auto", False) == "chacha20"
    # auto takes the other end's explicit choice, whatever the CPUs.
    assert aead.resolve("auto", False, "aesgcm", False) == "aesgcm"
    assert aead.resolve("chacha20", True, "auto", True) == "chacha20"
    assert aead.resolve("none", True, "none", True) == "none"


@pytest.mark.parametrize("one, two", [("chacha20", "aesgcm"), ("none", "aesgcm"), ("auto", "none"),
                                      ("none", "auto")])
def test_two_ends_that_disagree_are_refused_naming_both(one, two):
    with pytest.raises(WireError, match=f"stage 1 has --encrypt {one}, stage 2 has --encrypt {two}"):
        aead.resolve(one, True, two, True)


def test_a_choice_needs_the_shared_secret_and_a_known_name():
    assert aead.check_choice("none", None) == "none"
    assert aead.check_choice("auto", SECRET) == "auto"
    with pytest.raises(UsageError, match="--encrypt chacha20 needs PARETOPIPE_SECRET"):
        aead.check_choice("chacha20", None)
    with pytest.raises(UsageError, match="valid choices are none, auto, chacha20, aesgcm"):
        aead.check_choice("des", SECRET)
    with pytest.raises(WireError, match="unknown cipher choice"):
        aead.resolve("rot13", True, "auto", True)


def test_each_direction_has_its_own_key_new_for_every_connection():
    a = aead.derive_keys(SECRET, "n1", "n2", "aesgcm")
    assert a[0] != a[1]  # stage 1 -> 2 and 2 -> 1
    assert aead.derive_keys(SECRET, "n1", "n3", "aesgcm") != a  # another handshake, other keys
    assert aead.derive_keys(SECRET, "n1", "n2", "chacha20") != a  # bound to the cipher too
    assert aead.derive_keys(b"another-secret-0123456789abcdef!", "n1", "n2", "aesgcm") != a
    one, two = aead.Channel.for_stage(1, "aesgcm", SECRET, "n1", "n2"), aead.Channel.for_stage(2, "aesgcm", SECRET, "n1", "n2")
    header, body = bytes(range(104)), bytearray(b"activation" * 100)
    sealed = bytearray(one.send.seal(header, body))
    assert len(sealed) == len(body) + aead.TAG_BYTES and bytes(body) not in bytes(sealed)
    copy = bytearray(sealed)
    two.recv.open_in_place(header, memoryview(sealed))
    assert bytes(sealed[:len(body)]) == bytes(body)
    # The same sealed bytes once more: the receiver's counter moved on, so the replay fails.
    with pytest.raises(WireError, match="failed authentication"):
        two.recv.open_in_place(header, memoryview(copy))
    assert one.usage()["frames_sealed"] == 1 and two.usage()["frames_opened"] == 1


def test_a_sealed_frames_header_is_authenticated_with_it():
    one, two = aead.Channel.for_stage(1, "chacha20", SECRET, "a", "b"), aead.Channel.for_stage(2, "chacha20", SECRET, "a", "b")
    header = bytearray(104)
    sealed = bytearray(one.send.seal(bytes(header), b"payload"))
    header[20] ^= 1  # the sequence number, relabelled on the way
    with pytest.raises(WireError, match="failed authentication"):
        two.recv.open_in_place(bytes(header), memoryview(sealed))


def test_the_profiler_fit_recovers_a_linear_cost_and_times_the_real_cipher():
    points = [(n, 5e-6 + n / 2e9) for n in (1 << 10, 1 << 14, 1 << 18, 1 << 20, 1 << 22)]
    fit = aead._fit(points)
    assert fit["fixed_s"] == pytest.approx(5e-6) and fit["bytes_per_s"] == pytest.approx(2e9)
    assert aead._fit([(1024, 1e-6), (2048, 1e-6)])["bytes_per_s"] is None  # flat: no rate
    timed = aead.time_cipher("chacha20", sizes=(1024, 65536), repetitions=2)
    assert [p["bytes"] for p in timed["points"]] == [1024, 65536]
    assert all(p["seal_s"] > 0 and p["open_s"] > 0 for p in timed["points"])
    assert set(timed) == {"seal", "open", "points", "aes_instructions"}
