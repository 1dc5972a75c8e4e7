"""Stage 1 of a TCP run, the data source: it reads the inputs, computes its part, keeps up to
``in_flight`` batches outstanding and stamps each one's latency on its own clock alone (a run's
frames are drawn in the package's docstring).

A :class:`~paretopipe.transport.policy.SplitPolicy` decides each batch's cuts: a static run's
are the run's own, an adaptive run's follow the link (SWITCH announces a change before the batch
that uses it). A *guarded* run (an adaptive one, or any run given ``deadline_s``) keeps one batch
in flight and waits for each result up to the deadline: a result that does not come in time, or a
stage 2 that is gone, is finished here from the activation already computed (``served_locally``),
a late result is dropped by its sequence number, and a stage 2 that connects again to the
listener gets the RUN replayed and the next batches."""

from __future__ import annotations

import dataclasses
import itertools
import logging
import time
from typing import Any, Callable, Iterable

import torch

from ... import engines, records
from ...compute import cputrace
from ...errors import ParetoPipeError, PeerError
from ...network.conditions import NetworkConditions
from ...network.emulated import EmulatedLink, Outage
from ...partition import wirequant
from ...partition.stages import SegmentChains, StageBuilder, StageTimer
from .. import pipeline, wire
from ..endpoint import SourceEndpoint
from ..policy import SplitPolicy
from ..resources import ResourceMeter
from ..runconfig import RunConfig
from ..bookkeeping import BatchBook
from .connection import Connection, FrameSender
from .faultrun import MAX_EXTRA_BATCHES, FaultRun
from .handshake import StageListener
from .messages import check_part, json_payload, read_result_meta
from .nextstage import NextStage, run_start
from .sourceprobes import PolicyProbes
from .outcome import later_parts, link_manifest_of, merge_peer_seals

log = logging.getLogger("paretopipe.tcp")
#: What a guarded run counts (the record's stage-1 manifest, ``adaptive`` or ``fallback``).
COUNTS = ("switches", "served_locally", "deadline_misses", "peer_losses", "reconnects", "late_results_dropped",
          "probes", "probe_bytes")


class Stage1Run(PolicyProbes, SourceEndpoint):
    """Stage 1's endpoint: starts the run on the next stage, computes its part with the cuts the
    policy gives, sends it, and takes every result off the connection as it arrives (a guarded
    run settles each batch before the next: the result, or the rest of the model here)."""

    def __init__(self, connection: Connection, builder: StageBuilder, cfg: RunConfig, policy: SplitPolicy, *,
                 run_id: str, conditions: NetworkConditions | None, link_manifest: dict[str, Any],
                 listener: StageListener | None, keep_outputs: bool, meter: ResourceMeter,
                 cpu_traces: cputrace.Replays | None = None,
                 on_fault: Callable[[dict[str, Any]], None] | None = None) -> None:
        book = BatchBook(cfg)
        super().__init__(cfg, builder, book, cfg.timeout_s * (1 + book.total))
        self.policy, self.run_id = policy, run_id
        self.conditions, self.link_manifest, self.listener = conditions, link_manifest, listener
        self.keep_outputs, self.meter = keep_outputs, meter
        self.guarded = policy.adaptive or cfg.deadline_s is not None
        self.first_connection = connection
        self.link: EmulatedLink | None = None
        self.next: NextStage | None = None
        self.timer = StageTimer(builder.device)
        self.codec = wire.Codec(cfg.compression, cfg.compression_level, cfg.wire_dtype)
        # The energy window: the first measured batch's start to the last one's result.
        book.on_measured_start, book.on_measured_complete = meter.begin, meter.end
        self.outputs: dict[int, Any] = {}
        self.error: BaseException | None = None
        self.sealed = connection.channel is not None
        self.cuts: list[str] = list(cfg.cuts)  # the batch's, between admit and send
        self.out: Any = None
        self.sent_at = 0.0
        self.counts = dict.fromkeys(COUNTS, 0)
        self.events: list[dict[str, Any]] = []
        self._probe_seq = 0
        self.cpu_traces = cpu_traces
        self.cpu_trace_summaries: list[dict[str, Any]] = []
        # A fault (paretopipe.faults): the link's is applied here, stage 2's by on_fault.
        self.outage = Outage()
        self.fault = FaultRun(cfg.fault, book, cfg.warmup, cfg.timeout_s, on_fault, self.outage) \
            if cfg.fault is not None else None
        if self.fault is not None:
            self.spare_batches = MAX_EXTRA_BATCHES
        # A policy that watches compute: this stage runs its part segment by segment, each timed.
        self.chains = SegmentChains(builder, policy.segments, engines.stage_engine(cfg.engine, 0),
                                    cfg.batch_size) if policy.segments else None
        self.chain = None

    # -- the next stage ------------------------------------------------------------------------
    def _start_next(self, connection: Connection, deadline: float) -> None:
        """RUN on ``connection`` (the first time, or replayed to a stage 2 that came back). The
        configuration goes as the run has it: a stage 2 starts at the run's cuts, and an adaptive
        one is moved from there by SWITCH."""
        connection.sock.settimeout(self.cfg.timeout_s)
        connection.send(wire.RUN, meta=dataclasses.asdict(run_start(self.run_id, self.cfg, self.link_manifest,
                                                                    self.conditions)))
        ok = wire.expect(connection.reader.read(deadline), wire.RUN_OK)
        if self.guarded:
            connection.sock.settimeout(None)  # the deadline is kept per batch, not by the socket
        streaming = None if self.guarded else self._landed
        self.next = NextStage(connection, self.link, list(self.cfg.cuts), streaming, None if self.guarded else self._failed,
                              outage=self.outage)
        self.policy.start(ok.meta or {})

    def open(self) -> None:
        """Start the run on the next stage; the link (and a trace's replay) starts once the policy
        has what it needs, the policy's startup probes are timed, then the batches' clock starts."""
        cfg = self.cfg
        # An adaptive stage 2 profiles itself before its RUN_OK: it gets longer to answer.
        profiling_s = 120 if self.policy.adaptive else 0
        self._start_next(self.first_connection, time.monotonic() + cfg.timeout_s + profiling_s)
        if self.conditions is not None:
            self.link = EmulatedLink(self.conditions.up, seed=cfg.seed)
            self.link_manifest.update(link_manifest_of(self.conditions, True, None, self.link))
            self.next.sender.close()
            self.next.sender = FrameSender(self.first_connection.writer, self.link, "stage1-send", self.outage)
        for size in self.policy.startup_probes():
            self._probe(size)
        if self.cpu_traces is not None:
            self.cpu_traces.start()  # from the same instant as the batches' clock and the link's trace
        self.book.start_clock()
        if self.link is not None and self.link.trace is not None:  # where the replay is at start_s = 0
            self.link_manifest["trace_up"] = self.link.manifest(clock_zero=self.book.t0)["trace"]

    def local_rest(self) -> torch.nn.Module:
        """The rest of the model where stage 1 serves a batch itself: on stage 1's own engine."""
        return self.builder.engine_stage([self.cuts[0]], 1, engines.stage_engine(self.cfg.engine, 0),
                                         self.cfg.batch_size)

    def _serve_here(self, seq: int, gave_up: float) -> None:
        """The rest of the model on this node, from the activation already computed (all of it at k = K)."""
        result, local_s = self.timer.run(self.local_rest(), self.out, self.builder.device)
        self._keep(seq, result)
        self._served_here(seq, gave_up, local_s, {})

    def _served_here(self, seq: int, gave_up: float, local_s: float, fields: dict[str, Any]) -> None:
        self.counts["served_locally"] += 1
        self.book.complete(seq, time.monotonic(), served_locally=True, local_compute_s=local_s,
                           gave_up_s=round(gave_up - self.book.t0, 6), **fields)
        self.result_landed(seq, fields)

    def _lose_next(self, why: str, seq: int) -> None:
        log.warning("stage 1: stage 2 lost at batch %d (%s); serving locally until one connects", seq, why)
        self.counts["peer_losses"] += 1
        self.events.append({"seq": seq, "event": "peer_lost", "why": why[:200]})
        if self.next is not None:
            self.next.close()
        self.next = None

    def _reconnect(self, seq: int) -> None:
        if self.listener is None:
            return
        try:
            connection = self.listener.connection(0.001)
        except PeerError:
            return
        try:
            self._start_next(connection, time.monotonic() + self.cfg.timeout_s)
        except (ParetoPipeError, OSError) as exc:
            connection.close()
            log.warning("stage 1: a returning stage 2 failed its RUN: %s", exc)
            return
        self.counts["reconnects"] += 1
        self.events.append({"seq": seq, "event": "reconnected", "address": connection.address})

    def _late(self) -> None:
        self.counts["late_results_dropped"] += 1  # an earlier batch's result, after its deadline

    # -- a streaming run's results ---------------------------------------------------------------
    def _result_fields(self, f: wire.Frame) -> dict[str, Any]:
        """A result's fields for its batch record: what every later stage reported (durations,
        seal openings, bytes sent on) and what receiving it cost here."""
        num_stages = len(self.cfg.cuts) + 1
        fields = read_result_meta(f.meta, num_stages, self.sealed)
        fields.update(result_decode_s=f.decode_s, result_wire_bytes=f.wire_nbytes)
        if self.sealed:
            fields["result_open_s"] = f.open_s
        if num_stages > 2:  # what crossed each hop, the result's way back last
            rec = self.book.batches.get(f.seq, {})
            fields["hop_bytes"] = [rec.get("wire_bytes")] + [
                fields[f"stage{j}_wire_bytes"] for j in range(2, num_stages)] + [f.wire_nbytes]
        return fields

    def _landed(self, f: wire.Frame, now: float) -> None:
        """A result off the link (the reader has decoded it: now is when it is usable); a
        generation's carries the step's token, which feeds the stream's next step."""
        self._complete(f, now, self._result_fields(f))

    def _complete(self, f: wire.Frame, now: float, fields: dict[str, Any]) -> None:
        """A batch served by the next stages: its record, and a generation's token fed on."""
        fields.update(self.result_fields(f.seq, f.meta))
        self._keep(f.seq, f.tensor)
        self.book.complete(f.seq, now, output=f.tensor if self.harness is not None else None, **fields)
        f.release()
        self.result_landed(f.seq, fields)

    def _failed(self, exc: BaseException) -> None:
        self.error = exc
        self.book.unblock()

    def _keep(self, seq: int, result: Any) -> None:
        if self.keep_outputs and result is not None:  # a generation's result is its token, in its record
            self.outputs[seq] = tuple(t.detach().clone() for t in result) if isinstance(result, tuple) \
                else result.detach().clone()

    def check(self) -> None:
        if self.guarded:
            return  # a guarded run finds a lost stage 2 when it settles a batch
        if self.error is not None:
            raise self.error
        if self.next is not None and self.next.sender.error is not None:
            raise self.next.sender.error

    # -- the schedule's actions ------------------------------------------------------------------
    def admit(self, seq: int) -> None:
        if self.fault is not None and (event := self.fault.begin_if_due(seq)) is not None:
            self.events.append(event)
        if self.guarded and self.next is None:
            self._reconnect(seq)
        self.book.acquire(self.check)
        self.cuts, fields = self.policy.cuts_for(seq, self.next.cuts if self.next else None)
        if self.guarded:
            fields.update(served_locally=False, switched=False)
        self.rec = self.book.start(seq, **fields, **self.workload_fields(seq))

    def compute(self, seq: int) -> None:
        if self.chains is not None:
            self.chain = self.chains.chain(self.cuts[0], 0, keep_inputs=True)
            self.out, compute_s = self.timer.run(self.chain, self.x, self.builder.device)
            self.policy.observe_compute(seq, 0, self.chain.first, self.chain.times)
        else:
            self.out, compute_s = self.timer.run(self.builder.stage_for(self.cfg, 0), self.x, self.builder.device)
        self.rec["stage1_compute_s"] = compute_s

    def _on_sent(self, rec: dict[str, Any], enc: wire.Encoded) -> Callable[[float], None]:
        """Stamps a batch's send time (and, sealed, what sealing took, which is part of it)."""
        if self.sealed:
            return lambda s: rec.update(stage1_send_s=s, stage1_seal_s=enc.seal_s)
        return lambda s: rec.__setitem__("stage1_send_s", s)

    def send(self, seq: int) -> None:
        if self.next is None:
            return  # a guarded run with no stage 2: settle serves the batch here
        try:
            if self.cuts != self.next.cuts:
                self.next.sender.submit(wire.encode(wire.SWITCH, seq, meta={"cuts": list(self.cuts)}))
                self.next.cuts = list(self.cuts)
                self.rec["switched"] = True
                self.counts["switches"] += 1
            enc = self._tensor_frame(seq)
            self.rec.update(stage1_encode_s=enc.encode_s, payload_bytes=enc.raw_nbytes, wire_bytes=enc.wire_nbytes)
            self.sent_at = time.monotonic()
            self.next.sender.submit(enc, on_sent=self._on_sent(self.rec, enc))
        except (ParetoPipeError, OSError) as exc:
            if not self.guarded:
                raise
            self._lose_next(str(exc), seq)

    def _tensor_frame(self, seq: int) -> wire.Encoded:
        """The batch's TENSOR: the activation, in the run's wire dtype."""
        sent, quantise_s = wirequant.timed(wirequant.encode_activation, self.out, self.cfg.wire_dtype)
        enc = wire.frame(wire.TENSOR, seq, wire.encode_payload(sent, self.codec))
        enc.encode_s += quantise_s  # int8 and int4 are quantised before the codec: part of encoding
        return enc

    def settle(self, seq: int) -> None:
        """A guarded run's batch ends here: its result within the deadline, else the rest of the
        model on this node; then the policy's observation and the probes it asks for."""
        rec, cfg = self.rec, self.cfg
        f, why, arrived = None, "no stage 2", time.monotonic()
        if self.next is not None:
            limit = cfg.deadline_s if cfg.deadline_s is not None else cfg.timeout_s
            f, arrived, why = self.next.await_frame(wire.RESULT, seq, self.sent_at + limit, self._late)
        if f is not None:
            fields = self._result_fields(f)
            if self.chains is not None:
                self._observe_stage2(seq, f.meta)
            # Network time: the wait, less every stage's reported work and this stage's receiving.
            work = sum(fields[k] or 0.0 for k in records.work_fields(fields))
            self.policy.observe(rec["wire_bytes"], arrived - self.sent_at - work, "result")
            self._stage2_served()
            self._complete(f, arrived, fields)
            if self.fault is not None:
                self.fault.settled(seq, False, arrived)
        else:
            if why == "deadline":
                self.counts["deadline_misses"] += 1
                rec["deadline_missed"] = True
                # The batch took at least this long on the network: let the estimate know.
                self.policy.observe(rec["wire_bytes"], arrived - self.sent_at, "late")
            elif self.next is not None:
                self._lose_next(why, seq)
            self._serve_here(seq, arrived)
            if self.fault is not None:
                self.fault.settled(seq, True, arrived)
        if seq >= self.book.total - 1 and self.fault is None:
            return  # the run's last batch: stage 2's compute loop has ended, and nothing is decided after it
        self.measure_for_policy(seq)

    def _stage2_served(self) -> None:
        """A guarded batch that stage 2 served (a generation's tail then drops what it kept)."""

    def run(self) -> None:
        try:
            super().run()
        finally:
            if self.cpu_traces is not None:
                self.cpu_trace_summaries = self.cpu_traces.stop()
            if self.next is not None:
                self.next.sender.close()

    def actions(self) -> Iterable[pipeline.Action]:
        if self.harness is not None:
            return super().actions()
        planned = pipeline.source_actions(self.book.total, settle=self.guarded)
        if self.fault is None:
            return planned
        return itertools.chain(planned[:-1], self.fault.more(), planned[-1:])

    # -- after the run ---------------------------------------------------------------------------
    def workload_part(self) -> dict[str, Any]:
        """What stage 1's part of the record adds for its workload (image batches: nothing)."""
        return {}

    def stage_engine(self) -> dict[str, Any] | None:
        """The engine stage 1 ran its part on, for its manifest."""
        return self.builder.engine_of(self.cfg, 0)

    def manifest_part(self) -> dict[str, Any]:
        """The stage-1 manifest's account of a guarded run's decisions, under ``adaptive`` or
        ``fallback`` (nothing for a streaming run)."""
        traced = {"cpu_traces": self.cpu_trace_summaries} if self.cpu_trace_summaries else {}
        if not self.guarded:
            return traced
        body = {**self.counts, **self.policy.summary(), "deadline_s": self.cfg.deadline_s,
                "events": self.events[-200:]}
        return {"adaptive" if self.policy.adaptive else "fallback": body, **traced}

    def exchange(self, part1: dict[str, Any]) -> list[dict[str, Any]]:
        """Stage 1's part to the next stage (which writes the record where the anchor did); the
        later stages' parts back."""
        nxt = self.next
        nxt.sender.close()
        nxt.connection.send_json(wire.RECORDS, part1)
        f, _, why = nxt.await_frame(wire.RECORDS, 0, time.monotonic() + self.cfg.timeout_s, self._late)
        if f is None:
            raise PeerError(f"stage 2 sent no records ({why})")
        later = later_parts(check_part(json_payload(f), "stage 2", False), 2, len(nxt.cuts) + 1)
        merge_peer_seals([part1, *later])
        return later


    def finish(self, ok: bool) -> Connection | None:
        """The connection still open for the next run (``None`` after a failure, which closes
        every connection the run had); a stage 2 that replaced the first one leaves it closed."""
        after = self.next.connection if self.next is not None else None
        if not ok:
            for c in {self.first_connection, after} - {None}:
                c.close()
            return None
        if after is not self.first_connection:
            self.first_connection.close()
        if after is not None:
            after.runs += 1
        return after
