"""Split language-model runs over the TCP data port: a prefill, then one token at a time.

The handshake is the data port's (the identity is the model's name, its weights' digest and its
vocabulary). Per run, as for images, but a result feeds the next input::

    stage 1 (embed, first layers, the prompts)          last stage (last layers, LM head, the choice)
    LMRUN {config}              ->
                                <-  RUN_OK
    TENSOR {stream, start} x S  ->  (hidden states of the prompt's tokens: the prefill)
                                <-  RESULT {stream, token} x S
    TENSOR {stream, start}      ->  (the hidden state of that token: a decode step) ... G tokens
    RECORDS                     ->
                                <-  RECORDS {parts: [each later stage's part]}

A middle stage forwards TENSOR and RECORDS and relays RESULT. Each stage keeps the KV cache of
its own layers for every stream; what crosses is the hidden state (``--cut-dtype``) and the
position it starts at; the last stage chooses the token. Up to S streams are in flight at once,
so while one stage computes a stream the others can compute theirs."""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from pathlib import Path
from typing import Any

import torch

from ... import records
from ...errors import ParetoPipeError, PeerError, UsageError, WireError
from ...llm.build import LMSource
from ...llm.generate import reference_model
from ...llm.shapes import CUT_DTYPES, check_plan, stage_blocks
from ...llm.stage import LMStage, cut_nbytes, decode_cut, encode_cut
from ...llm.summary import summarize
from ...network.conditions import Direction, NetworkConditions
from ...network.emulated import EmulatedLink
from .. import wire
from .connection import Connection, FrameSender
from .handshake import StageListener
from ..lmrun import LM_RECORD_KIND, LMRunConfig, LMStages, count_hop, hop_figures, new_hop_bytes, stage_part
from .messages import json_payload, json_tensor, message, safe_run_id
from .outcome import link_manifest_of

log = logging.getLogger("paretopipe.tcp")


@dataclasses.dataclass
class LMRunStart:
    run_id: str
    config: dict[str, Any]
    stage: int = 1  # which stage receives it, 0-based
    return_link: dict[str, Any] | None = None
    forward_link: dict[str, Any] | None = None


@dataclasses.dataclass
class LMIdentity:
    """What the handshake compares: the data port's identity fields for a language model."""

    name: str
    fingerprint: str
    num_classes: int  # the vocabulary: a peer with another head is another model

    @classmethod
    def of(cls, src: LMSource) -> "LMIdentity":
        return cls(src.name, src.identity(), src.shape.vocab_size)

    def as_dict(self) -> dict[str, Any]:
        return {"model": self.name, "fingerprint": self.fingerprint, "num_classes": self.num_classes,
                "wire_version": wire.VERSION}


@dataclasses.dataclass
class LMOutcome:
    record: dict[str, Any]
    path: Path | None
    tokens: list[list[int]]


def _payload(tensors: tuple[torch.Tensor, ...]) -> torch.Tensor | tuple[torch.Tensor, ...]:
    """One tensor as itself; an int8 cut's values and scales as a live set of two."""
    return tensors[0] if len(tensors) == 1 else tensors


# -- stage 1 --------------------------------------------------------------------------------

def run_lm_stage1(listener: StageListener, src: LMSource, cfg: LMRunConfig, prompts: list[list[int]], *,
                  conditions: NetworkConditions | None, connect_timeout: float, output_dir: str | None,
                  threads: int | None, run_id: str | None = None) -> LMOutcome:
    """``partition1.py``'s run: wait for the later stage, run once, say goodbye."""
    connection = listener.connection(connect_timeout)
    try:
        outcome = run_lm(connection, LMStages(src), cfg, prompts, conditions=conditions, output_dir=output_dir,
                         threads=threads, run_id=run_id)
    except BaseException:
        connection.close()
        raise
    connection.close(bye=True)
    return outcome


def run_lm(connection: Connection, stages: "LMStages", cfg: LMRunConfig, prompts: list[list[int]], *,
           conditions: NetworkConditions | None, output_dir: str | Path | None, threads: int | None,
           run_id: str | None = None) -> LMOutcome:
    """Stage 1's run on an open connection (which may carry more runs): send the RUN, generate
    ``cfg.gen_tokens`` tokens for every stream, collect the later stages' parts, write the record
    (an incomplete one too, then raise)."""
    src = stages.src
    check_plan(src.shape, cfg.splits)
    run_id = safe_run_id(run_id or f"{src.name}_llm_s{'-'.join(map(str, cfg.splits))}_{time.strftime('%Y%m%d-%H%M%S')}")
    stage = stages.get(cfg.splits, 0)
    start = LMRunStart(run_id, dataclasses.asdict(cfg), 1,
                       conditions.down.to_dict() if conditions else None,
                       conditions.up.to_dict() if conditions and len(cfg.splits) > 1 else None)
    status, error, steps, parts = "complete", None, [], []
    tokens: list[list[int]] = [[] for _ in range(cfg.streams)]
    link = EmulatedLink(conditions.up, seed=cfg.seed) if conditions else None
    sender = FrameSender(connection.writer, link, "stage1-send")
    hop_bytes = new_hop_bytes()
    try:
        connection.sock.settimeout(cfg.timeout_s)
        connection.send(wire.RUN, meta=dataclasses.asdict(start))
        wire.expect(connection.reader.read(time.monotonic() + cfg.timeout_s), wire.RUN_OK)
        run = _Generation(connection, sender, stage, cfg, hop_bytes)
        for w in range(cfg.warmup):  # not measured: first-call costs of every stage, on streams of their own
            run.generate({cfg.streams + w: prompts[0][:8]}, 2)
        run.clock.clear()
        tokens_by_stream = run.generate(dict(enumerate(prompts)), cfg.gen_tokens, count_bytes=True)
        tokens = [tokens_by_stream[s] for s in range(cfg.streams)]
        steps = run.clock
        sequences = (torch.tensor([p + t for p, t in zip(prompts, tokens)], dtype=torch.int64)
                     if cfg.check_exact else None)
        sender.submit(wire.encode(wire.RECORDS, 0, sequences))
        parts = _read_parts(connection, cfg, len(cfg.splits))
    except (ParetoPipeError, OSError) as exc:
        status, error = "incomplete", str(exc)
    finally:
        sender.close()
    own = stage_part(stage, 0, cfg, src, hop_bytes["prefill"] + hop_bytes["decode"], threads)
    stage_parts = [own, *parts]
    hops = hop_figures(stage_parts, hop_bytes, cfg)
    record = {"kind": LM_RECORD_KIND, "backend": "tcp", "run_id": run_id, "status": status, "error": error,
              "config": dataclasses.asdict(cfg),
              "manifest": {"link": link_manifest_of(conditions, conditions is not None, None, link),
                           "cipher": connection.cipher},
              "stages": stage_parts, "hops": hops, "steps": steps, "tokens": tokens,
              "summary": summarize(steps, stage_parts, hops, cfg.streams, cfg.power_idle_w, cfg.power_core_w)}
    path = (records.atomic_write_json(Path(output_dir) / f"{run_id}.json", record) if output_dir is not None
            else None)
    if status != "complete":
        raise PeerError(f"the run did not complete: {error}" + (f" (incomplete record {path})" if path else ""))
    return LMOutcome(record, path, tokens)


def _read_parts(connection: Connection, cfg: LMRunConfig, later: int) -> list[dict[str, Any]]:
    got = connection.recv_json(wire.RECORDS, time.monotonic() + cfg.timeout_s + 600)
    parts = got.get("parts")
    if not isinstance(parts, list) or len(parts) != later or not all(isinstance(p, dict) for p in parts):
        raise WireError(f"the later stages' RECORDS must carry {later} parts")
    return parts


class _Generation:
    """Stage 1's side of generating: each stream's next step is computed and sent as soon as its
    previous token comes back; every token's time is stamped on this clock."""

    def __init__(self, connection: Connection, sender: FrameSender, stage: LMStage, cfg: LMRunConfig,
                 hop_bytes: dict[str, int]) -> None:
        self.connection, self.sender, self.stage, self.cfg = connection, sender, stage, cfg
        self.hop_bytes = hop_bytes
        self.seq = 0
        self.clock: list[dict[str, Any]] = []

    def _send(self, stream: int, step: int, ids: list[int], start: int, count: bool) -> tuple[int, float]:
        sent = time.monotonic()
        h = self.stage.forward(stream, torch.tensor([ids]), start)
        tensors = encode_cut(h, self.cfg.cut_dtype)
        if count:
            count_hop(self.hop_bytes, start, cut_nbytes(tensors))
        self.seq += 1
        self.sender.submit(wire.encode(wire.TENSOR, self.seq, _payload(tensors), {"stream": stream, "start": start, "step": step}))
        return self.seq, sent

    def generate(self, prompts: dict[int, list[int]], gen_tokens: int, count_bytes: bool = False) -> dict[int, list[int]]:
        out: dict[int, list[int]] = {s: [] for s in prompts}
        position = {s: len(p) for s, p in prompts.items()}
        waiting: dict[int, tuple[int, int, float]] = {}  # seq -> stream, step, sent
        for s, p in prompts.items():
            seq, sent = self._send(s, 0, p, 0, count_bytes)
            waiting[seq] = (s, 0, sent)
        while waiting:
            if self.sender.error is not None:
                raise self.sender.error
            f = self.connection.reader.read(time.monotonic() + self.cfg.timeout_s)
            wire.expect(f, wire.RESULT)
            if f.seq not in waiting:
                raise WireError(f"a result for step {f.seq}, which is not in flight")
            stream, step, sent = waiting.pop(f.seq)
            token = f.meta.get("token")
            if f.meta.get("stream") != stream or not isinstance(token, int) or not 0 <= token < 1 << 31:
                raise WireError(f"the result of step {f.seq} must name stream {stream} and a token id")
            done = time.monotonic()
            out[stream].append(token)
            self.clock.append({"stream": stream, "step": step, "sent_s": sent, "done_s": done, "token": token})
            if step + 1 < gen_tokens:
                seq, sent = self._send(stream, step + 1, [token], position[stream], count_bytes)
                position[stream] += 1
                waiting[seq] = (stream, step + 1, sent)
        return out


# -- later stages --------------------------------------------------------------------------

def serve_lm_connection(connection: Connection, src: LMSource, *, threads: int | None = None,
                        timeout_s: float | None = None, downstream: Any = None) -> list[dict[str, Any]]:
    """Serve language-model runs on a connection until BYE; returns this stage's parts. A run this
    stage cannot take, or a malformed frame, is answered with ERROR and ends the run in one line."""
    stages = LMStages(src)
    done = []
    bye = False
    try:
        while True:
            connection.sock.settimeout(None)
            f = connection.reader.read()
            if f.kind == wire.BYE:
                bye = True
                return done
            meta = wire.expect(f, wire.RUN).meta
            done.append(_LaterStage(connection, src, stages, meta, threads, timeout_s, downstream).serve())
    finally:
        connection.close()
        if downstream is not None:
            downstream.close(bye)


class _LaterStage:
    def __init__(self, connection: Connection, src: LMSource, stages: LMStages, meta: dict[str, Any],
                 threads: int | None, timeout_s: float | None, downstream: Any) -> None:
        self.connection, self.src, self.threads = connection, src, threads
        self.next: Connection | None = None
        try:
            self.start = message(LMRunStart, meta, "LMRUN")
            safe_run_id(self.start.run_id)
            self.cfg = message(LMRunConfig, self.start.config, "stage 1's run configuration")
            if self.cfg.identity != src.identity() or self.cfg.model != src.name:
                raise WireError(f"stage 1 runs {self.cfg.model} ({self.cfg.identity}), this stage has {src.name} "
                                f"({src.identity()})")
            if self.cfg.cut_dtype not in CUT_DTYPES:
                raise WireError(f"cut dtype {self.cfg.cut_dtype!r}: one of {', '.join(CUT_DTYPES)}")
            check_plan(src.shape, list(self.cfg.splits))
            self.timeout_s = timeout_s or self.cfg.timeout_s
            self.index, count = self.start.stage, len(self.cfg.splits) + 1
            if not 1 <= self.index < count:
                raise WireError(f"LMRUN names stage {self.index + 1} of {count}")
            self.last = self.index == count - 1
            if not self.last and downstream is None:
                raise UsageError(f"this is stage {self.index + 1} of {count}, a middle stage, but it has no next "
                                 f"stage (start it with --next-port)")
            if self.last and downstream is not None:
                raise UsageError(f"this stage waits for a next stage (--next-port) but is the last of {count}")
            self.stage = stages.get(list(self.cfg.splits), self.index)
            if not self.last:
                self.next = downstream.connect([f"lm{k}" for k in self.cfg.splits])
                self.next.sock.settimeout(self.timeout_s)
                self.next.send(wire.RUN, meta=dataclasses.asdict(dataclasses.replace(self.start, stage=self.index + 1)))
                wire.expect(self.next.reader.read(time.monotonic() + self.timeout_s), wire.RUN_OK)
        except (ParetoPipeError, OSError) as exc:
            try:
                connection.send(wire.ERROR, meta={"reason": f"stage {meta.get('stage', '?')} cannot run this: {exc}"})
            except (ParetoPipeError, OSError):
                pass
            raise WireError(f"stage 1 sent a run this stage cannot take: {exc}")
        back = Direction.from_dict(self.start.return_link) if self.start.return_link else None
        forward = Direction.from_dict(self.start.forward_link) if self.start.forward_link else None
        self.back = FrameSender(connection.writer, EmulatedLink(back, seed=self.cfg.seed, which="down") if back else None,
                                f"stage{self.index + 1}-send")
        self.forward = (FrameSender(self.next.writer, EmulatedLink(forward, seed=self.cfg.seed) if forward else None,
                                    f"stage{self.index + 1}-forward") if self.next is not None else None)
        self.hop_bytes = new_hop_bytes()
        self.relay_error: list[BaseException] = []
        self.logits: dict[tuple[int, int], torch.Tensor] = {}  # (stream, step): what this last stage chose from
        connection.send(wire.RUN_OK)

    def serve(self) -> dict[str, Any]:
        relay = None
        if self.next is not None:
            relay = threading.Thread(target=self._relay, name="lm-relay", daemon=True)
            relay.start()
        try:
            while True:
                f = self.connection.reader.read(time.monotonic() + self.timeout_s)
                if f.kind == wire.RECORDS:
                    return self._records(relay, f)
                wire.expect(f, wire.TENSOR)
                self._step(f)
        except (ParetoPipeError, OSError) as exc:
            try:
                self.connection.send(wire.ERROR, meta={"reason": f"stage {self.index + 1}: {exc}"})
            except (ParetoPipeError, OSError):
                pass
            raise
        finally:
            self.back.close()
            if self.forward is not None:
                self.forward.close()

    def _step(self, f: wire.Frame) -> None:
        stream, start, step = (f.meta.get(k) for k in ("stream", "start", "step"))
        streams = self.cfg.streams + self.cfg.warmup
        if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in (stream, start, step)) \
                or stream >= streams or step >= max(self.cfg.gen_tokens, 2):
            raise WireError(f"step {f.seq}: a TENSOR must name a stream 0..{streams - 1}, a start position and a "
                            f"step 0..{max(self.cfg.gen_tokens, 2) - 1}")
        x = self._checked_input(f, start)
        f.release()
        try:
            h = self.stage.forward(stream, x, start)
        except ValueError as exc:
            raise WireError(f"step {f.seq}: {exc}")
        if self.last:
            if self.cfg.check_exact and stream < self.cfg.streams:
                self.logits[(stream, step)] = h[0].clone()
            token = self.cfg.sampling.choose(h[0], stream, step)
            self.back.submit(wire.encode(wire.RESULT, f.seq, None, {"stream": stream, "token": token}))
            return
        tensors = encode_cut(h, self.cfg.cut_dtype)
        if stream < self.cfg.streams:
            count_hop(self.hop_bytes, start, cut_nbytes(tensors))
        self.forward.submit(wire.encode(wire.TENSOR, f.seq, _payload(tensors), {"stream": stream, "start": start, "step": step}))

    def _checked_input(self, f: wire.Frame, start: int) -> torch.Tensor:
        tensors = f.tensor if isinstance(f.tensor, tuple) else (f.tensor,)
        if any(t is None for t in tensors):
            raise WireError(f"step {f.seq}: a TENSOR without its tensor")
        first_block = stage_blocks(self.src.shape, list(self.cfg.splits), self.index)[0]
        if first_block == 0:  # token ids cross: (1, T) int64, within the vocabulary
            t = tensors[0]
            if len(tensors) != 1 or t.dtype != torch.int64 or t.dim() != 2 or t.shape[0] != 1 or t.shape[1] < 1:
                raise WireError(f"step {f.seq}: split 0 carries token ids as int64 (1, T), got "
                                f"{t.dtype} {tuple(t.shape)}")
            if bool(((t < 0) | (t >= self.src.shape.vocab_size)).any()):
                raise WireError(f"step {f.seq}: a token id outside the vocabulary of {self.src.shape.vocab_size}")
            return t.clone()
        hidden = self.src.shape.hidden_size
        want = {"float32": (torch.float32,), "float16": (torch.float16,), "bfloat16": (torch.bfloat16,),
                "int8": (torch.int8, torch.float32)}[self.cfg.cut_dtype]
        got = tuple(t.dtype for t in tensors)
        t = tensors[0]
        if got != want or t.dim() != 3 or t.shape[0] != 1 or t.shape[1] < 1 or t.shape[2] != hidden \
                or (len(tensors) == 2 and tuple(tensors[1].shape) != (1, t.shape[1], 1)):
            raise WireError(f"step {f.seq}: expected a hidden state (1, T, {hidden}) as {self.cfg.cut_dtype}, got "
                            f"{' + '.join(f'{x.dtype} {tuple(x.shape)}' for x in tensors)}")
        if start + t.shape[1] > self.src.shape.max_position_embeddings:
            raise WireError(f"step {f.seq}: positions past the model's {self.src.shape.max_position_embeddings}")
        x = decode_cut(tuple(x.clone() for x in tensors))
        if not bool(torch.isfinite(x).all()):
            raise WireError(f"step {f.seq}: the hidden state holds NaN or infinity")
        return x

    def _exactness(self, sequences: torch.Tensor | None) -> dict[str, Any]:
        """Token agreement and the largest logit difference against the unsplit float32 model,
        fed the run's own tokens (teacher-forced), so every step is compared on the same context."""
        cfg = self.cfg
        want = (cfg.streams, cfg.prompt_tokens[0] + cfg.gen_tokens)
        if sequences is None or sequences.dtype != torch.int64 or tuple(sequences.shape) != want \
                or len(set(cfg.prompt_tokens)) != 1 or bool(((sequences < 0) | (sequences >= self.src.shape.vocab_size)).any()):
            raise WireError(f"RECORDS must carry the streams' token ids as int64 {want} for the exactness check")
        reference = reference_model(self.src)
        prompt = cfg.prompt_tokens[0]
        agree, steps, worst = 0, 0, 0.0
        with torch.inference_mode():
            for stream in range(cfg.streams):
                logits = reference(input_ids=sequences[stream:stream + 1, :-1]).logits[0]
                for step in range(cfg.gen_tokens):
                    ref = logits[prompt - 1 + step]
                    got = self.logits.get((stream, step))
                    if got is None:
                        raise WireError(f"no logits kept for stream {stream} step {step}")
                    worst = max(worst, float((ref - got).abs().max()))
                    agree += cfg.sampling.choose(ref, stream, step) == int(sequences[stream, prompt + step])
                    steps += 1
        return {"reference": "the unsplit model in float32, teacher-forced on the generated tokens",
                "token_agreement": agree / steps, "max_logit_diff": worst, "steps": steps}

    def _relay(self) -> None:
        """A middle stage: the next stage's results go back as they come, until its RECORDS."""
        try:
            while True:
                f = self.next.reader.read()
                if f.kind == wire.RECORDS:
                    self.relayed = json_payload(f)
                    return
                wire.expect(f, wire.RESULT)
                self.back.submit(wire.encode(wire.RESULT, f.seq, None, dict(f.meta)))
        except BaseException as exc:  # reported when RECORDS are due
            self.relay_error.append(exc)

    def _records(self, relay: threading.Thread | None, f: wire.Frame) -> dict[str, Any]:
        own = stage_part(self.stage, self.index, self.cfg, self.src,
                          self.hop_bytes["prefill"] + self.hop_bytes["decode"], self.threads)
        own["hop_bytes"] = dict(self.hop_bytes)
        sequences = f.tensor.clone() if isinstance(f.tensor, torch.Tensor) else None
        f.release()
        if self.last and self.cfg.check_exact:
            own["exactness"] = self._exactness(sequences)
        parts = [own]
        if self.next is not None:
            self.forward.submit(wire.encode(wire.RECORDS, 0, sequences))
            relay.join(self.timeout_s + 600)
            if self.relay_error or relay.is_alive():
                raise PeerError(f"the next stage's results: {self.relay_error[0] if self.relay_error else 'timed out'}")
            later = self.relayed.get("parts") if isinstance(self.relayed, dict) else None
            if not isinstance(later, list):
                raise WireError("the next stage's RECORDS carry no parts")
            parts += later
        self.back.submit(wire.encode(wire.RECORDS, 0, json_tensor({"parts": parts})))
        self.back.close()
        return own
