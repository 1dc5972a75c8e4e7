"""One run at a later stage of a TCP run (:mod:`.serving` serves a connection's runs until BYE):
it computes its part of each batch on one thread. The last stage returns results with its own
durations; a middle stage (a chain of more than two: Pi -> Pi -> server) sends its part on to the
next stage and relays the results back, adding its own. An adaptive run (two stages) adds SWITCH
(the split moves between two batches) and PROBE (answered at once), through ``tcp.switching``."""

from __future__ import annotations

import dataclasses
import logging
import queue
import socket
import threading
import time
from typing import Any, Callable

from torch import nn

from ...compute import cpushare
from ...errors import ParetoPipeError, PeerError, UsageError, WireError
from ...manifest import node_manifest
from ...network.conditions import Direction
from ...network.emulated import EmulatedLink
from ...partition.activation import live_tensors
from ...partition.stages import StageBuilder, TimedChain
from ...sysmon import SystemMonitor
from .. import pipeline, wire
from ..resources import stage_meter
from ..runconfig import RunConfig
from ..bookkeeping import measured_images
from .connection import Connection, FrameSender
from .downstream import Downstream
from .messages import RunStart, check_part, json_payload, message, read_result_meta, result_meta_fields, safe_run_id
from .outcome import cipher_usage, later_parts
from .stageitems import StageItems, stage_items
from .switching import KINDS as SWITCHING_KINDS, Retime, SwitchingStage

log = logging.getLogger("paretopipe.tcp")


class SinkRun:
    """One run as a later stage: this thread reads the previous stage's frames while a compute
    thread drives :func:`pipeline.stage_actions` over this endpoint (``recv`` takes the batches in
    arrival order, a SWITCH taking its turn between two of them; ``send`` returns the result, or
    in a middle stage sends the activation on). A middle stage also relays the next stage's results
    back on a thread of its own, adding its durations."""

    def __init__(self, connection: Connection, builder: StageBuilder, meta: dict[str, Any], timeout_s: float | None,
                 *, threads: int | None, limits: dict[str, Any] | None,
                 sealed_before: dict[str, Any] | None = None, downstream: Downstream | None = None) -> None:
        self.connection, self.builder = connection, builder
        self.sealed = connection.channel is not None
        back, forward = self._accept(meta, timeout_s, downstream)
        cfg = self.cfg
        ok_meta = self.adaptive.run_ok_meta() if self.adaptive is not None else None
        # Before RUN_OK: a first run measures idle power while stage 1 waits, idle too.
        self.meter = stage_meter(builder, cfg, self.index)
        connection.send(wire.RUN_OK, meta=ok_meta)
        self.manifest = node_manifest(builder.device, threads, role=self.name, weights_fingerprint=builder.fingerprint,
                                      limits=limits)
        self.sender = FrameSender(connection.writer, EmulatedLink(back, seed=cfg.seed, which="down") if back else None,
                                  f"{self.name}-send")
        self.forward: FrameSender | None = None
        if self.next is not None:
            self.forward = FrameSender(self.next.writer, EmulatedLink(forward, seed=cfg.seed) if forward else None,
                                       f"{self.name}-forward")
            self.codec = wire.Codec(cfg.compression, cfg.compression_level, self.items.codec_dtype)
        self.work: queue.Queue = queue.Queue()
        self.seen: dict[int, dict[str, Any]] = {}
        self.compute_error: list[BaseException] = []
        self.sysmon: dict[str, Any] = {}
        self.sealed_before = sealed_before  # the connection's AEAD counters when RUN came
        self.current: tuple[wire.Frame, float] | None = None  # the batch between recv and send
        self.out: Any = None
        self.relayed: queue.Queue = queue.Queue()  # the next stage's RECORDS, or why they never came
        self.segment_times: dict[str, Any] = {}  # the batch's per-segment compute, for an adaptive stage 1
        self.steps: dict[int, Any] = {}  # inputs decoded on arrival (dequantised, a step's), until computed

    def _accept(self, meta: dict[str, Any], timeout_s: float | None,
                downstream: Downstream | None) -> tuple[Direction | None, Direction | None]:
        """The RUN, checked (returns the down direction it asks for, and a middle stage's forward
        direction); a run this stage cannot take is answered with ERROR, then refused. A middle
        stage passes the RUN on and waits for the next stage's RUN_OK first."""
        self.next: Connection | None = None
        try:
            self.start = message(RunStart, meta, "RUN")
            self.run_id = safe_run_id(self.start.run_id)
            # Stage 1 derived the run's deadline from its link; this stage's own --timeout overrides it
            # here, while the record keeps the configuration stage 1 sent.
            self.cfg = RunConfig.from_dict(self.start.config, "stage 1's run configuration")
            self.timeout_s = timeout_s or self.cfg.timeout_s
            self.index, stages = self.start.stage, len(self.cfg.cuts) + 1
            if not 1 <= self.index < stages:
                raise WireError(f"RUN names stage {self.index + 1} of a {stages}-stage plan; a later stage is "
                                f"2..{stages}")
            self.name = f"stage{self.index + 1}"
            self.fields = result_meta_fields(self.index + 1) + ((f"{self.name}_open_s",) if self.sealed else ())
            back = Direction.from_dict(self.start.return_link) if self.start.return_link else None
            forward = Direction.from_dict(self.start.forward_link) if self.start.forward_link else None
            self.items: StageItems = stage_items(self.builder, self.cfg, self.index)
            self.stage = self.items.stage
            self.adaptive = SwitchingStage(self.builder, self.cfg) if self.cfg.adaptive else None
            if self.adaptive is not None:
                self.stage = self.adaptive.initial()
            if self.index < stages - 1:
                if downstream is None:
                    raise UsageError(f"this is stage {self.index + 1} of {stages}, a middle stage, but it has no next "
                                     "stage to send to (start it with --next-port)")
                self._start_next(downstream)
            elif downstream is not None:
                raise UsageError(f"this stage waits for a next stage (--next-port) but is the last of {stages}")
        except (ParetoPipeError, OSError) as exc:
            try:
                self.connection.send(wire.ERROR, meta={"reason": f"{_stage_named(meta)} cannot run this: {exc}"})
            except (ParetoPipeError, OSError):
                pass
            raise WireError(f"stage 1 sent a run this stage cannot take: {exc}")
        return back, forward

    def _start_next(self, downstream: Downstream) -> None:
        """Pass the RUN on to the next stage, which must answer RUN_OK."""
        self.next = downstream.connect(list(self.cfg.cuts))
        self.next.sock.settimeout(self.timeout_s)
        self.next.send(wire.RUN, meta=dataclasses.asdict(dataclasses.replace(self.start, stage=self.index + 1)))
        wire.expect(self.next.reader.read(time.monotonic() + self.timeout_s), wire.RUN_OK)

    # -- the endpoint that pipeline.drive runs on the compute thread ---------------------------
    def _compute_loop(self) -> None:
        cpushare.join_compute_thread()
        try:
            pipeline.drive(pipeline.stage_actions(self._total()), self)
        except BaseException as exc:
            self.compute_error.append(exc)
            # Stage 1 hears why now, not at its timeout (a step out of its stream's place, say).
            self._end_upstream(f"{self.name} refused the run: {exc}")

    def _total(self) -> int | None:
        """The run's batches (None: a LoadGen run's, as many as LoadGen issues; a fault run's, which
        goes on until the split is whole again)."""
        if self.cfg.loadgen is not None or self.cfg.fault is not None:
            return None
        return self.cfg.warmup + self.cfg.num_batches

    def recv(self, _slot: int) -> object:
        while True:
            item = self.work.get()
            if item is None:
                return pipeline.STOP
            if isinstance(item, nn.Module):  # a SWITCH, in order between two batches
                self.stage = item
                continue
            if isinstance(item, Retime):
                self.sender.submit(wire.frame(wire.PROBE_ACK, item.seq, meta=self.adaptive.retime(item)))
                continue
            self.current = item
            return item

    def compute(self, _slot: int) -> None:
        f, arrived = self.current
        began = time.monotonic()
        self.out, compute_s = self.items.forward(f, self.steps.pop(f.seq, None), self.stage)
        self.seen[f.seq].update({f"{self.name}_queue_s": began - arrived, f"{self.name}_compute_s": compute_s})
        if isinstance(self.stage, TimedChain):  # an adaptive run's policy watches each segment
            self.segment_times = {"stage2_segment_first": self.stage.first, "stage2_segment_s": list(self.stage.times)}

    def send(self, _slot: int) -> None:
        f, _ = self.current
        rec = self.seen[f.seq]
        if self.forward is not None:
            tensors, meta = self.items.onward(f, self.out)
            enc = wire.frame(wire.TENSOR, f.seq, wire.encode_payload(tensors, self.codec), meta)
            rec.update({f"{self.name}_encode_s": enc.encode_s, f"{self.name}_wire_bytes": enc.wire_nbytes})
            self.forward.submit(enc, on_sent=lambda _s: f.release())
            return
        payload, extra = self.items.result(f, self.out)
        rec[f"{self.name}_encode_s"] = wire.encode_seconds(payload)
        # The activation's buffer goes back to the pool once the result is on the wire: an empty
        # last stage (k = K) returns its input itself, sent straight from that buffer.
        enc = wire.frame(wire.RESULT, f.seq, payload, {**{k: rec[k] for k in self.fields}, **self.segment_times,
                                                       **extra})
        self.sender.submit(enc, on_sent=self._on_sent(f, rec, enc))

    def _on_sent(self, f: wire.Frame, rec: dict[str, Any], enc: wire.Encoded) -> Callable[[float], None]:
        measured = rec["seq"] >= self.cfg.warmup

        def sent(_s: float) -> None:
            f.release()
            if self.sealed:
                rec[f"{self.name}_seal_s"] = enc.seal_s
            if measured:
                self.meter.end()  # the energy window closes with the last measured result sent
        return sent

    def _relay_results(self) -> None:
        """A middle stage's second reader: the next stage's results go back towards stage 1 with this
        stage's durations added, until the next stage's RECORDS."""
        later = len(self.cfg.cuts) + 1
        try:
            while True:
                f = wire.expect(self.next.reader.read(), wire.RESULT, wire.RECORDS)
                if f.kind == wire.RECORDS:
                    self.relayed.put(json_payload(f))
                    return
                rec = self.seen.get(f.seq)
                if rec is None or f"{self.name}_wire_bytes" not in rec:
                    raise WireError(f"the next stage returned batch {f.seq}, which this stage never sent it")
                meta = read_result_meta(f.meta, later, self.next.channel is not None, first=self.index + 2)
                meta.update({k: rec.get(k) for k in self.fields})
                meta[f"{self.name}_wire_bytes"] = rec[f"{self.name}_wire_bytes"]
                meta.update(self.items.relayed(f.meta))
                enc = wire.frame(wire.RESULT, f.seq, wire.encode_payload(f.tensor), meta)
                self.sender.submit(enc, on_sent=self._on_sent(f, rec, enc))
        except BaseException as exc:
            self.relayed.put(exc)
            self._end_upstream(f"stage {self.index + 1}'s next stage failed: {exc}")

    def _end_upstream(self, why: str) -> None:
        """Tell the stage before why the run ends, then end the connection, so that stage 1 hears
        it now rather than at its timeout. The ERROR goes through the ordered sender (another
        thread writing the socket could split a frame), after the results already queued."""
        def shut(_sent: float | None = None) -> None:
            try:
                self.connection.sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        if self.sender.error is not None:
            shut()
            return
        self.sender.submit(wire.frame(wire.ERROR, 0, meta={"reason": why[:300]}), on_sent=shut)

    def serve(self) -> tuple[dict[str, Any] | None, BaseException | None]:
        """Batches until stage 1's RECORDS: (the parts that came with them or None, the failure or None)."""
        worker = threading.Thread(target=self._compute_loop, name=f"{self.name}-compute", daemon=True)
        worker.start()
        if self.next is not None:
            self.next.sock.settimeout(None)  # the relay thread waits as long as the run lasts
            threading.Thread(target=self._relay_results, name=f"{self.name}-relay", daemon=True).start()
        failure: BaseException | None = None
        part1 = None
        self.connection.sock.settimeout(self.timeout_s)
        with SystemMonitor(gpu=self.builder.device.startswith("cuda")) as mon, self.meter:
            try:
                part1 = self._receive()
            except (ParetoPipeError, OSError, KeyboardInterrupt) as exc:
                failure = self._relay_failure() or (self.compute_error[0] if self.compute_error else exc)
                if isinstance(exc, (WireError, UsageError)):  # a frame this stage refuses: say which, and why
                    self._end_upstream(f"{self.name} refused the run: {exc}")
            finally:
                self.work.put(None)
                worker.join(timeout=self.timeout_s)
                if self.forward is not None:
                    self.forward.close()
                self.sender.close()  # every result is on the wire (the window's end) before the meter stops
        mon.stop()
        self.sysmon = mon.summary()
        return part1, failure

    def _relay_failure(self) -> BaseException | None:
        """Why the next stage failed, when that is why this stage's upstream ended."""
        if self.next is None or self.relayed.empty():
            return None
        item = self.relayed.queue[0]
        return PeerError(f"the next stage failed: {item}") if isinstance(item, BaseException) else None

    def _receive(self) -> dict[str, Any]:
        cfg, total = self.cfg, self._total()
        kinds = (wire.TENSOR, wire.RECORDS) + (SWITCHING_KINDS if self.adaptive is not None else ())
        while True:
            f = wire.expect(self.connection.reader.read(), *kinds)
            if self.compute_error:
                raise self.compute_error[0]
            for sender in (self.sender, self.forward):
                if sender is not None and sender.error is not None:
                    raise sender.error
            if f.kind == wire.RECORDS:
                return check_part(json_payload(f), "stage 1", True)
            if f.kind == wire.SWITCH:
                stage, incoming = self.adaptive.switch(f.meta)
                self.work.put(stage)
                self.items.switched(incoming)
                continue
            if f.kind == wire.PROBE:
                retime = self.adaptive.retime_request(f.seq, f.meta)
                f.release()
                if retime is not None:  # a compute probe: timed on the compute thread, between batches
                    self.work.put(retime)
                else:
                    self.sender.submit(wire.frame(wire.PROBE_ACK, f.seq))
                continue
            if f.seq in self.seen or f.seq < 0 or (total is not None and f.seq >= total):
                raise WireError(f"batch {f.seq} sent twice or out of range 0..{'' if total is None else total - 1}")
            if f.tensor is None:
                raise WireError(f"batch {f.seq} carries no tensor")
            x, decode_s = self.items.decode(f)  # checked here, before the compute thread sees it
            if x is not None:
                self.steps[f.seq] = x
            self.seen[f.seq] = {"seq": f.seq, "warmup": f.seq < cfg.warmup, f"{self.name}_decode_s": f.decode_s + decode_s,
                                "payload_bytes": f.raw_nbytes, "wire_bytes": f.wire_nbytes}
            live = live_tensors(self.steps.get(f.seq, f.tensor))
            if cfg.loadgen is not None and live:  # a LoadGen batch is a query of its own size
                self.seen[f.seq]["images"] = int(live[0].shape[0])
            if f.seq >= cfg.warmup:
                self.meter.begin()  # the energy window opens with the first measured batch in
            if self.sealed:
                self.seen[f.seq][f"{self.name}_open_s"] = f.open_s
            self.work.put((f, time.monotonic()))

    def own_parts(self, sequences: Any = None) -> tuple[dict[str, Any], dict[str, Any]]:
        """This stage's part of the record, and the smaller one it sends on (its manifest, system
        metrics and resources; sealed, its seal times per batch; a generation's part, the last
        stage's exactness check on ``sequences``, stage 1's token ids)."""
        manifest = {**self.manifest, "cipher": cipher_usage(self.connection, self.sealed_before),
                    "transport": self.connection.transport_usage(),
                    "energy_sensors": self.meter.manifest(),
                    "engine": self.items.engine()}
        resources = self.meter.part(measured_images(list(self.seen.values()), self.cfg))
        if self.adaptive is not None:
            manifest = {**manifest, "adaptive": self.adaptive.manifest()}
        batches = [self.seen[s] for s in sorted(self.seen)]
        sent: dict[str, Any] = {"manifest": manifest, "sysmon": self.sysmon, "resources": resources}
        if self.sealed:
            seal = f"{self.name}_seal_s"
            sent["batches"] = [{"seq": b["seq"], "warmup": b["warmup"], seal: b.get(seal)} for b in batches]
        extra = self.items.part(sequences)  # a generation's part, the last stage's exactness check
        own = {"manifest": manifest, "sysmon": self.sysmon, "batches": batches, "resources": resources, **extra}
        return own, {**sent, **extra}

    def exchange_parts(self, part1: dict[str, Any] | None) -> list[dict[str, Any] | None]:
        """Every stage's part in stage order, for the record. Stage 1's part came with its RECORDS
        (with ``before``: the middle stages' it passed); a middle stage sends them on with its own
        and waits for the next stage's (with ``later``: the stages after it); then this stage's part
        and the later ones go back. A failed run exchanges nothing."""
        sequences = ((part1 or {}).get("generation") or {}).get("sequences")
        try:
            own, sent = self.own_parts(sequences)
        except WireError as exc:  # stage 1's RECORDS carry no usable sequences: the run stands, its check does not
            log.warning("%s: %s", self.name, exc)
            own, sent = self.own_parts(None)
        if part1 is None:
            return [None] * self.index + [own]
        before = [check_part(p, f"stage {i + 2}", False) for i, p in enumerate(part1.pop("before", None) or [])]
        if len(before) != self.index - 1:
            log.warning("%s: stage 1's RECORDS carry %d middle stages' parts, not %d", self.name, len(before),
                        self.index - 1)
            before = (before + [None] * self.index)[:self.index - 1]
        later: list[dict[str, Any]] = []
        try:
            if self.next is not None:
                self.next.send_json(wire.RECORDS, {**part1, "before": [*before, sent]})
                item = self.relayed.get(timeout=self.timeout_s)
                if isinstance(item, BaseException):
                    raise PeerError(f"the next stage sent no records: {item}")
                later = later_parts(check_part(item, f"stage {self.index + 2}", False), self.index + 2,
                                    len(self.cfg.cuts) + 1)
            self.connection.send_json(wire.RECORDS, {**sent, "later": later} if later else sent)
        except (ParetoPipeError, OSError, queue.Empty) as exc:
            log.warning("%s: could not exchange records with its neighbours: %s", self.name, exc or "timeout")
        return [part1, *before, own, *later]


def _stage_named(meta: Any) -> str:
    """Which stage a RUN was meant for, for the refusal that goes back (stage 2 unless it says)."""
    stage = meta.get("stage", 1) if isinstance(meta, dict) else 1
    ok = isinstance(stage, int) and not isinstance(stage, bool) and 1 <= stage < 64
    return f"stage {stage + 1 if ok else 2}"
