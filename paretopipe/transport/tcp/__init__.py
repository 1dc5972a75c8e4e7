"""TCP socket backend: stage 1 (the data source, listens) and later stages (connect), binary frames.

A **connection** is authenticated once and carries any number of runs, so a sweep pays for
connecting and authenticating once per pair of stage workers, not once per configuration:

    stage 1                      stage 2
    CHALLENGE {nonce, auth}  ->
                             <-  HELLO {model, fingerprint, num_classes, wire_version, cuts?, nonce, mac?}
    HELLO_OK {mac?}          ->
    (per run)
    RUN {run_id, config, ...}->
                             <-  RUN_OK
    TENSOR x N               ->
                             <-  RESULT x N (each with stage 2's durations)
    RECORDS (stage 1's part) ->
                             <-  RECORDS (stage 2's manifest and system metrics)
    (end)
    BYE                      ->

A **chain** of more than two stages (Pi -> Pi -> GPU server; stage 1 runs ``--split k1,k2``) is
the same protocol hop by hop. A middle stage connects to the stage before and listens for the
next (``partition2.py --next-port``); it is a sink that forwards:

    stage 1                 stage 2 (middle)                 stage 3 (last)
    RUN {stage: 1} ->       RUN {stage: 2} ->
                                            <- RUN_OK
                   <- RUN_OK
    TENSOR x N     ->       computes, TENSOR x N ->          computes
                            adds its durations <- RESULT x N
                   <- RESULT x N (every later stage's durations, each hop's bytes)
    RECORDS        ->       RECORDS {before: [stage 2's part]} ->
                            <- RECORDS (stage 3's part)
                   <- RECORDS (stage 2's part, later: [stage 3's])

Every stage writes the same record with every stage's part; latency is still stamped on stage
1's clock alone. Each hop's frames take the network's up direction, results the down direction.

An adaptive run (``split_index`` "adaptive", its policy built by controller/adaptive_setup.py) adds three control
frames: stage 2 answers RUN_OK with its own brief self-profile; SWITCH {cuts} between two batches
moves the split from the next batch on (stage 2 holds every segment); PROBE (a few bytes or a
fixed-size filler) is answered at once by PROBE_ACK, so stage 1 can measure the link between
batches; a PROBE whose meta is ``{"retime": [0, n]}`` is a compute probe instead, answered when
stage 2's compute thread has timed its first n segments on a synthetic batch, the times in the
PROBE_ACK's meta. None of them is accepted in a static run. Stage 1 decides each batch's cuts through a
split policy (``transport.policy``); a static run given a deadline is settled batch by batch as an
adaptive one is: a late result is dropped, the batch finished on stage 1, and a stage 2 that
comes back to the listener is sent the RUN again.

Stage 1 stamps each batch on its own monotonic clock when it starts, and again when stage 2's
result has come back and been decoded: that difference is the end-to-end latency, with no clock
of another machine involved. With ``in_flight`` W > 1 up to W batches are outstanding; sender and
receiver threads on each side let compute, transfer and the peer's compute overlap. The up
direction of the network conditions shapes stage 1's frames, the down direction the results.

Everything a peer sends is validated before use. The listener accepts concurrently and gives every
connection one deadline for its whole handshake, so a silent or dripping stranger can neither hold
nor crash it; a refused stranger costs the real peer nothing.

One concept per module: ``messages`` (typed frames and their JSON), ``connection`` (sockets, the
connection, the ordered sender), ``handshake`` (the listener and both halves of the handshake),
``source`` (stage 1's endpoint and run; ``sourceprobes`` what it measures for its split policy
between batches), ``sink`` (a later stage's endpoint and run, a middle stage's forwarding included),
``serving`` (a later stage's runs on a connection until BYE; ``downstream`` a middle stage's way on),
``switching`` (a later stage's half of an adaptive run: its
self-profile and the SWITCHes it obeys) and ``outcome`` (the run record). Both endpoints are driven by
:func:`paretopipe.transport.pipeline.drive`, the one driver of every backend.
"""

from ..messaging.sockets import connect_with_retry, listen
from .connection import Connection, FrameSender, is_loopback
from .handshake import HANDSHAKE_TIMEOUT_S, MAX_PENDING_HANDSHAKES, StageListener, identity_of, open_connection
from .messages import RESULT_META_FIELDS, check_part, json_payload, result_duration, safe_run_id
from .outcome import RunOutcome, assemble_record, link_manifest_of, write_record
from .downstream import Downstream
from .serving import serve_connection
from .stage1 import run_on_connection, run_stage1
from .switching import self_profile_cuts, self_profile_timings

__all__ = ["Connection", "Downstream", "FrameSender", "HANDSHAKE_TIMEOUT_S", "MAX_PENDING_HANDSHAKES", "RESULT_META_FIELDS",
           "RunOutcome", "StageListener", "assemble_record", "check_part", "connect_with_retry", "identity_of",
           "is_loopback", "json_payload", "link_manifest_of", "listen", "open_connection", "result_duration",
           "run_on_connection", "run_stage1", "safe_run_id", "self_profile_cuts", "self_profile_timings", "serve_connection",
           "write_record"]
