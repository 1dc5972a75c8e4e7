"""PyTorch RPC backend: an N-stage pipeline over torch.distributed.rpc (TensorPipe).

Rank 0 (``master``) holds the data. It builds every other rank's stage on that rank through a
remote reference (``rpc.remote``: the rank builds the model itself; no module ever crosses the
network), and before each run *configures* it: its stage's cuts, where to send its output (the
next stage's reference, or the master's collector), and its link's direction; a stage
re-partitions in place, so ranks live for a whole sweep. A batch travels master -> stage 1 -> ...
-> last stage, each stage forwarding straight to the next; the last stage hands the result to
the master, which stamps it on its own monotonic clock. A language model's generation runs the
same way, a step at a time, the last stage's token fed back by the master.

Where the data source sits is a choice (``source``): ``master`` (the anchor's layout: the master
only holds the data, so the input crosses one extra socket before stage 1) or ``stage1`` (the
master computes stage 1 itself, as the TCP backend's stage 1 does; one rank fewer).

One concern per module: ``agent`` (joining the group, names, the layout), ``rank`` (a rank's
stage and the master's collector), ``master`` (the group's references and a run).

Trust: torch.distributed.rpc serialises Python arguments with pickle on its wire. We send only
tensors, numbers, short strings and small lists, but the transport itself must only ever connect
hosts you trust, on a private network. The TCP backend has no such caveat.
"""

import torch.distributed.rpc as rpc

from .agent import MASTER, NO_RPC_TIMEOUT, backend_options, init, layout, worker_name
from .master import RankGroup, run_master
from .rank import Collector, RankStage, StageSpec

__all__ = ["Collector", "MASTER", "NO_RPC_TIMEOUT", "RankGroup", "RankStage", "StageSpec", "backend_options", "init",
           "layout", "rpc", "run_master", "worker_name"]
