"""Joining the RPC group: the ranks' names, TensorPipe's options as applied, and where each stage
of a plan runs."""

from __future__ import annotations

from typing import Any

import torch.distributed.rpc as rpc

from ...errors import UsageError
from ..runconfig import RPC_SOURCES, RPC_TRANSPORTS

MASTER = "master"
#: Hops carry batches without a timeout of their own (0 is infinite to torch's RPC): a batch on a
#: slow link may take minutes, and the master's deadline, derived from the link
#: (:mod:`paretopipe.network.deadlines`), is the one clock that judges progress; a dead rank is
#: caught by ``check_alive`` and the agent's failure detection.
NO_RPC_TIMEOUT = 0


def worker_name(rank: int) -> str:
    return MASTER if rank == 0 else f"worker{rank}"


def backend_options(transport: str, num_threads: int, timeout_s: float, init_method: str):
    """TensorPipe options. ``uv`` forces its TCP transport and the basic channel (so two processes
    on one host still pay for a real socket, and shaping applies); ``auto`` lets it pick shared
    memory. They must be given to the constructor: the C++ agent never reads attributes set later."""
    if transport not in RPC_TRANSPORTS:
        raise UsageError(f"--rpc-transport {transport!r}: valid {', '.join(RPC_TRANSPORTS)}")
    kwargs: dict[str, Any] = {"num_worker_threads": num_threads, "rpc_timeout": timeout_s, "init_method": init_method}
    if transport == "uv":
        kwargs.update(_transports=["uv"], _channels=["basic"])
    return rpc.TensorPipeRpcBackendOptions(**kwargs)


def init(rank: int, world_size: int, master_addr: str, master_port: int, transport: str = "uv",
         num_threads: int = 16, timeout_s: float = 60.0) -> dict[str, Any]:
    """Join the RPC group; returns what was applied, for the manifest."""
    opts = backend_options(transport, num_threads, timeout_s, f"tcp://{master_addr}:{master_port}")
    rpc.init_rpc(worker_name(rank), rank=rank, world_size=world_size, rpc_backend_options=opts)
    return {"transport": "tensorpipe/uv (TCP), channel basic" if transport == "uv" else "tensorpipe/auto",
            "num_worker_threads": num_threads}


def layout(num_stages: int, source: str) -> list[int]:
    """The rank of each stage (0-based): ``master`` puts stage j on rank j + 1 (the master only
    holds the data); ``stage1`` puts stage j on rank j, the first stage on the master itself."""
    if source not in RPC_SOURCES:
        raise UsageError(f"--rpc-source {source!r}: valid {', '.join(RPC_SOURCES)}")
    return list(range(1, num_stages + 1)) if source == "master" else list(range(num_stages))
