"""Stage 1's adaptive runtime: choose the split per batch from the measured link, switch with a
control frame, and finish a batch locally when stage 2 is gone or late.

One batch is in flight at a time, so a switch falls between two batches by construction. Per batch:

1. if there is no stage 2, look for a new one on the listener (it replays the RUN and continues);
2. ask the chooser (predict/adaptive.py) for a split from the device profiles and the smoothed
   link estimate; a change is announced by SWITCH before the batch's frame;
3. run stage 1's part, send it, wait for the result up to the deadline;
4. if the result does not come (stage 2 died, or the deadline passed), run stage 2's part here
   from the activation already computed, and mark the batch ``served_locally``. A late result that
   still arrives is dropped by its sequence number;
5. feed the batch's network time (the peer's reported work taken out) to the estimator.

When the current split sends only small frames, the rate cannot be seen in them, so once
``PROBE_INTERVAL_S`` has passed without a rate sample a fixed-size PROBE is timed between batches
(outside any batch's latency, inside the run's wall time, so it costs throughput; counted in the
record). Every figure in the record is measured on stage 1's clock.
"""

from __future__ import annotations

import dataclasses
import logging
import queue
import threading
import time
from pathlib import Path
from typing import Any

import torch

from .. import cpushare, records
from ..errors import ParetoPipeError, PeerError, UsageError, WireError
from ..manifest import node_manifest
from ..network.conditions import NetworkConditions
from ..network.emulated import EmulatedLink
from ..partition.stages import StageBuilder, StageTimer
from ..partition.structure import check_splits
from ..predict.adaptive import (LARGE_FRAME_BYTES, PROBE_ALPHA, PROBE_BYTES, SMALL_FRAME_BYTES, LinkEstimator,
                                SplitChooser, self_profile)
from ..predict.device_profile import DeviceProfile, check_compatible, codec_key
from ..sysmon import SystemMonitor
from ..transport import inputs, tcp, wire
from ..transport.runconfig import RunConfig
from ..transport.schedule import status_of

log = logging.getLogger("paretopipe.adaptive")
PROBE_INTERVAL_S = 1.0
STARTUP_PINGS = 3
STARTUP_PROBES = 2


@dataclasses.dataclass
class _Peer:
    """The current stage 2: its connection, its sender, and the thread reading its frames."""

    connection: tcp.Connection
    sender: tcp.FrameSender
    inbox: queue.Queue
    split: int

    def close(self) -> None:
        self.sender.close(timeout=1.0)
        self.connection.close()


def _reader(connection: tcp.Connection, inbox: queue.Queue) -> None:
    try:
        while True:
            f = connection.reader.read()
            inbox.put((f, time.monotonic()))
            if f.kind == wire.RECORDS:
                return
    except (ParetoPipeError, OSError) as exc:
        inbox.put((exc, time.monotonic()))


class AdaptiveRun:
    """One adaptive run as stage 1 (see the module docstring)."""

    def __init__(self, builder: StageBuilder, cfg: RunConfig, *, listener: tcp.StageListener | None,
                 connection: tcp.Connection | None, conditions: NetworkConditions | None = None,
                 observed_link: dict | None = None, threads: int | None = None,
                 limits: dict[str, Any] | None = None, keep_outputs: bool = False,
                 connect_timeout: float = 60.0, keep_connection: bool = False) -> None:
        if not cfg.adaptive:
            raise UsageError("AdaptiveRun takes a run with split_index 'adaptive'")
        self.builder, self.cfg, self.listener = builder, cfg, listener
        self.conditions, self.observed_link = conditions, observed_link
        self.threads, self.limits, self.keep_outputs = threads, limits, keep_outputs
        self.connect_timeout, self.keep_connection = connect_timeout, keep_connection
        # With keep_connection: the connection still open after the run, for the next one.
        self.connection_after: tcp.Connection | None = None
        part = builder.partitioner
        self.num_blocks = part.num_blocks
        self.block_cuts = part.block_cuts()
        self.bytes_per_image = [part.payload_nbytes(c, 1) for c in self.block_cuts]
        self.candidates = cfg.candidates if cfg.candidates is not None else list(range(self.num_blocks + 1))
        check_splits(self.candidates, self.num_blocks, builder.name, "adaptive candidate split")
        self.start_split = self.block_cuts.index(cfg.cuts[0]) if cfg.cuts[0] in self.block_cuts else None
        if self.start_split is None:
            raise UsageError(f"an adaptive run starts at a block split, not {cfg.cuts[0]!r}")
        self.emulated = conditions is not None and cfg.link_mode == "emulated"
        self.link: EmulatedLink | None = None
        self.estimator = LinkEstimator()
        self.timer = StageTimer(builder.device)
        self.peer: _Peer | None = None
        self._first_connection = connection
        self.outputs: dict[int, torch.Tensor] = {}
        self.batches: list[dict[str, Any]] = []
        self.events: list[dict[str, Any]] = []
        self.counts = {"switches": 0, "served_locally": 0, "deadline_misses": 0, "peer_losses": 0,
                       "reconnects": 0, "late_results_dropped": 0, "probes": 0, "probe_bytes": 0}
        self.t0 = time.monotonic()
        self.last_rate_sample = self.last_rtt_sample = self.t0

    # -- stage 2 -------------------------------------------------------------------------------
    def _start_peer(self, connection: tcp.Connection, run_id: str, link_manifest: dict[str, Any], split: int,
                    deadline: float) -> dict[str, Any]:
        """RUN on ``connection`` (the first time, or replayed to a stage 2 that came back)."""
        cfg = self.cfg.replace(cuts=[self.block_cuts[split]])
        connection.sock.settimeout(self.cfg.timeout_s)
        connection.send(wire.RUN, meta={"run_id": run_id, "config": cfg.to_dict(), "link": link_manifest,
                                        "return_link": self.conditions.down.to_dict() if self.emulated else None})
        ok = wire.expect(connection.reader.read(deadline), wire.RUN_OK)
        connection.sock.settimeout(None)  # the reader thread waits as long as the run lasts
        inbox: queue.Queue = queue.Queue()
        threading.Thread(target=_reader, args=(connection, inbox), name="adaptive-recv", daemon=True).start()
        self.peer = _Peer(connection, tcp.FrameSender(connection.writer, self.link, "adaptive-send"), inbox, split)
        self.free_choice = True
        return ok.meta or {}

    def _lose_peer(self, why: str, seq: int) -> None:
        log.warning("adaptive: stage 2 lost at batch %d (%s); serving locally until one connects", seq, why)
        self.counts["peer_losses"] += 1
        self.events.append({"seq": seq, "event": "peer_lost", "why": why[:200]})
        if self.peer is not None:
            self.peer.close()
        self.peer = None

    def _reconnect(self, seq: int, run_id: str, link_manifest: dict[str, Any], split: int) -> None:
        if self.listener is None:
            return
        try:
            connection = self.listener.connection(0.001)
        except PeerError:
            return
        try:
            self._start_peer(connection, run_id, link_manifest, split, time.monotonic() + self.cfg.timeout_s)
        except (ParetoPipeError, OSError) as exc:
            connection.close()
            log.warning("adaptive: a returning stage 2 failed its RUN: %s", exc)
            return
        self.counts["reconnects"] += 1
        self.events.append({"seq": seq, "event": "reconnected", "address": connection.address})

    def _await(self, kind: int, seq: int, deadline: float) -> tuple[wire.Frame | None, float, str | None]:
        """The peer's next ``kind`` frame for ``seq``: (frame, arrival, None), or (None, now, why)."""
        peer = self.peer
        while True:
            try:
                item, arrived = peer.inbox.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                return None, time.monotonic(), "deadline"
            if isinstance(item, BaseException):
                return None, arrived, f"{type(item).__name__}: {item}"
            if item.kind not in (wire.RESULT, wire.PROBE_ACK, wire.RECORDS):
                item.release()
                return None, arrived, f"unexpected {wire.KIND_NAMES.get(item.kind, item.kind)} frame"
            if item.kind == kind and item.seq == seq:
                return item, arrived, None
            if item.kind == wire.RESULT:
                self.counts["late_results_dropped"] += 1  # an earlier batch's result, after its deadline
            item.release()

    def _probe(self, nbytes: int, probe_seq: int) -> None:
        """Time one PROBE round trip through the link (between batches) and feed the estimator."""
        payload = torch.zeros(nbytes, dtype=torch.uint8) if nbytes else None
        enc = wire.encode(wire.PROBE, probe_seq, payload)
        sent = time.monotonic()
        self.peer.sender.submit(enc)
        f, arrived, why = self._await(wire.PROBE_ACK, probe_seq, sent + self.cfg.timeout_s)
        if f is None:
            raise PeerError(f"probe unanswered ({why})")
        f.release()
        self.estimator.observe(enc.wire_nbytes, arrived - sent, PROBE_ALPHA if nbytes else None)
        if nbytes:
            self.last_rate_sample = arrived
        else:
            self.last_rtt_sample = arrived
        self.counts["probes"] += 1
        self.counts["probe_bytes"] += enc.total_nbytes

    # -- one batch -----------------------------------------------------------------------------
    def _local_rest(self, act: torch.Tensor, split: int) -> tuple[torch.Tensor, float]:
        return self.timer.run(self.builder.stage([self.block_cuts[split]], 1), act, self.builder.device)

    def _batch(self, seq: int, x: torch.Tensor, chooser: SplitChooser) -> dict[str, Any]:
        cfg = self.cfg
        est = self.estimator.estimate
        choice = None
        if self.peer is not None:
            # The first choice on a connection is free; later ones pass the hysteresis.
            choice = chooser.choose(None if self.free_choice else self.peer.split, est)
            self.free_choice = False
        split = choice.split if choice else self.num_blocks
        start = time.monotonic()
        rec: dict[str, Any] = {"seq": seq, "warmup": seq < cfg.warmup, "start_s": start - self.t0,
                               "split_k": split, "served_locally": False, "switched": False,
                               **est.as_fields()}
        if choice is not None:
            rec["predicted_s" if cfg.objective == "latency" else "predicted_imgs_per_s"] = choice.predicted[split]
        act, compute1 = self.timer.run(self.builder.stage([self.block_cuts[split]], 0), x, self.builder.device)
        rec["stage1_compute_s"] = compute1
        result, why = None, "no stage 2"
        if self.peer is not None:
            try:
                if split != self.peer.split:
                    self.peer.sender.submit(wire.encode(wire.SWITCH, seq, meta={"cuts": [self.block_cuts[split]]}))
                    self.peer.split = split
                    rec["switched"] = True
                    self.counts["switches"] += 1
                enc = wire.frame(wire.TENSOR, seq, wire.encode_payload(act))
                rec.update(stage1_encode_s=enc.encode_s, payload_bytes=enc.raw_nbytes, wire_bytes=enc.wire_nbytes)
                sent = time.monotonic()
                self.peer.sender.submit(enc)
                limit = cfg.deadline_s if cfg.deadline_s is not None else cfg.timeout_s
                f, arrived, why = self._await(wire.RESULT, seq, sent + limit)
            except (ParetoPipeError, OSError) as exc:
                f, arrived, why = None, time.monotonic(), str(exc)
            if f is not None:
                durations = {k: tcp.result_duration(f.meta.get(k), k) for k in tcp.RESULT_META_FIELDS}
                result = f.tensor.clone()
                rec.update(result_decode_s=f.decode_s, result_wire_bytes=f.wire_nbytes, **durations)
                f.release()
                work2 = sum(v or 0.0 for v in durations.values()) + (rec["result_decode_s"] or 0.0)
                self.estimator.observe(rec["wire_bytes"], arrived - sent - work2)
            elif why == "deadline":
                self.counts["deadline_misses"] += 1
                rec["deadline_missed"] = True
                # The batch took at least this long on the network: let the estimate know.
                self.estimator.observe(rec["wire_bytes"], arrived - sent)
            else:
                self._lose_peer(why, seq)
        if result is None:
            # Finish the batch here from the activation already computed (the whole model if the
            # split was K).
            result, compute_local = self._local_rest(act, split)
            rec.update(served_locally=True, local_compute_s=compute_local)
            self.counts["served_locally"] += 1
        end = time.monotonic()
        rec.update(end_s=end - self.t0, latency_s=end - start)
        if self.keep_outputs:
            self.outputs[seq] = result.detach().cpu()
        return rec

    # -- the run -------------------------------------------------------------------------------
    def _profiles(self, remote: dict[str, Any]) -> list[DeviceProfile]:
        cfg = self.cfg
        if cfg.device_profiles:
            profiles = [DeviceProfile.load(p) for p in cfg.device_profiles]
            for w in check_compatible(profiles, self.builder.name):
                log.warning("adaptive: %s", w)
            return profiles
        if "profile" not in remote:
            raise WireError("stage 2 sent no self-profile with RUN_OK (is it an older ParetoPipe?)")
        mine = tcp.self_profile_timings(self.builder, cfg)
        self.self_profiles = {"stage1": mine, "stage2": remote["profile"]}
        return [self_profile(self.builder.name, cfg.batch_size, t, self.bytes_per_image, role)
                for role, t in (("stage1", mine), ("stage2", remote["profile"]))]

    def run(self, output_dir: str | Path | None = None) -> tcp.RunOutcome:
        cfg = self.cfg
        run_id = records.new_run_id(self.builder.name, "adaptive")
        manifest1 = node_manifest(self.builder.device, self.threads, role="stage1",
                                  weights_fingerprint=self.builder.fingerprint, limits=self.limits)
        self.self_profiles: dict[str, Any] | None = None
        failure: BaseException | None = None
        peer_part: dict[str, Any] | None = None
        link_manifest: dict[str, Any] = tcp.link_manifest_of(self.conditions, self.emulated, self.observed_link)
        started = time.monotonic()
        with SystemMonitor(gpu=self.builder.device.startswith("cuda")) as mon:
            try:
                cpushare.join_compute_thread()
                connection = self._first_connection or self.listener.connection(self.connect_timeout)
                remote = self._start_peer(connection, run_id, link_manifest, self.start_split,
                                          time.monotonic() + self.cfg.timeout_s + 120)
                profiles = self._profiles(remote)
                codec = codec_key(cfg.wire_dtype, cfg.compression)
                chooser = SplitChooser(profiles, cfg.batch_size, self.candidates, cfg.objective, codec)
                # The link, and with it a trace's replay, starts now: profiling is not on the trace.
                self.link = EmulatedLink(self.conditions.up, seed=cfg.seed) if self.emulated else None
                link_manifest.update(tcp.link_manifest_of(self.conditions, self.emulated, self.observed_link,
                                                          self.link))
                self.peer.sender.close()
                self.peer.sender = tcp.FrameSender(connection.writer, self.link, "adaptive-send")
                # Batch times count from the link's start, so they line up with the trace's replay.
                self.t0 = self.last_rate_sample = self.last_rtt_sample = time.monotonic()
                for i in range(STARTUP_PINGS + STARTUP_PROBES):
                    self._probe(0 if i < STARTUP_PINGS else PROBE_BYTES, i)
                log.info("adaptive: run %s started with %s (link estimate %s)", run_id, connection.address,
                         self.estimator.estimate.as_fields())
                batches = inputs.batches(cfg.dataset, cfg.batch_size, self.builder.input_size,
                                         cfg.warmup + cfg.num_batches, cfg.data_dir, cfg.seed)
                for seq in range(cfg.warmup + cfg.num_batches):
                    x = next(batches)
                    if self.peer is None:
                        self._reconnect(seq, run_id, link_manifest, self.num_blocks)
                    self.batches.append(self._batch(seq, x, chooser))
                    sent = self.batches[-1].get("wire_bytes")
                    if sent is not None and not self.batches[-1].get("deadline_missed"):
                        if sent >= LARGE_FRAME_BYTES:
                            self.last_rate_sample = time.monotonic()
                        elif sent <= SMALL_FRAME_BYTES:
                            self.last_rtt_sample = time.monotonic()
                    # Between batches: a rate probe when the split's frames are too small to show the
                    # rate, a ping when they are too large to show the RTT.
                    now = time.monotonic()
                    for size, last in ((PROBE_BYTES, self.last_rate_sample), (0, self.last_rtt_sample)):
                        if self.peer is not None and now - last >= PROBE_INTERVAL_S:
                            try:
                                self._probe(size, STARTUP_PINGS + STARTUP_PROBES + 2 * seq + (size == 0))
                            except (ParetoPipeError, OSError) as exc:
                                self._lose_peer(str(exc), seq)
            except (ParetoPipeError, OSError, KeyboardInterrupt) as exc:
                failure = exc
        mon.stop()
        status, error = status_of(failure)
        summary_extra = {**self.counts, "candidates": self.candidates, "objective": cfg.objective,
                         "deadline_s": cfg.deadline_s, "events": self.events[-200:],
                         "self_profiles": self.self_profiles,
                         "device_profiles": cfg.device_profiles}
        manifest1 = {**manifest1, "adaptive": summary_extra}
        part1 = {"manifest": manifest1, "sysmon": mon.summary(), "batches": self.batches}
        if failure is None and self.peer is not None:
            try:
                self.peer.sender.close()
                self.peer.connection.send_json(wire.RECORDS, part1)
                f, _, why = self._await(wire.RECORDS, 0, time.monotonic() + cfg.timeout_s)
                if f is None:
                    raise PeerError(f"stage 2 sent no records ({why})")
                peer_part = tcp.check_part(tcp.json_payload(f), "stage 2", False)
            except (ParetoPipeError, OSError) as exc:
                log.warning("adaptive: records exchange with stage 2 failed: %s", exc)
        if self.peer is not None:
            if self.keep_connection and failure is None and peer_part is not None:
                self.connection_after = self.peer.connection
            else:
                self.peer.connection.close(bye=failure is None)
        record = tcp.assemble_record(run_id, status, error, cfg, [part1, peer_part], link_manifest,
                                     {"run_wall_s": time.monotonic() - started, "written_by": "stage1"})
        path = tcp.write_record(record, output_dir)
        if failure is not None:
            raise failure
        outputs = [self.outputs[s] for s in sorted(self.outputs)] if self.keep_outputs else None
        return tcp.RunOutcome(record, path, outputs)
