"""Moving batches between stages: wire frames, inputs, the run configuration, the per-batch schedule,
and the two backends (raw TCP sockets, PyTorch RPC)."""
