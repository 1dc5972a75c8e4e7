"""TCP socket backend: stage 1 (the data source, listens) and stage 2 (connects), binary frames.

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

An adaptive run (``split_index`` "adaptive", driven by runners/adaptive.py) adds three control
frames: stage 2 answers RUN_OK with its own brief self-profile; SWITCH {cuts} between two batches
moves the split from the next batch on (stage 2 holds every segment); PROBE (a few bytes or a
fixed-size filler) is answered at once by PROBE_ACK, so stage 1 can measure the link between
batches. None of them is accepted in a static run.

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
``source`` (stage 1's run), ``sink`` (stage 2's runs) and ``outcome`` (the run record).
"""

from .connection import Connection, FrameSender, connect_with_retry, is_loopback, listen
from .handshake import HANDSHAKE_TIMEOUT_S, MAX_PENDING_HANDSHAKES, StageListener, identity_of, open_connection
from .messages import RESULT_META_FIELDS, check_part, json_payload, result_duration, safe_run_id
from .outcome import RunOutcome, assemble_record, link_manifest_of, write_record
from .sink import self_profile_timings, serve_connection
from .source import run_on_connection, run_stage1

__all__ = ["Connection", "FrameSender", "HANDSHAKE_TIMEOUT_S", "MAX_PENDING_HANDSHAKES", "RESULT_META_FIELDS",
           "RunOutcome", "StageListener", "assemble_record", "check_part", "connect_with_retry", "identity_of",
           "is_loopback", "json_payload", "link_manifest_of", "listen", "open_connection", "result_duration",
           "run_on_connection", "run_stage1", "safe_run_id", "self_profile_timings", "serve_connection",
           "write_record"]
