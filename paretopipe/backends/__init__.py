"""Pipeline backends: ``tcp`` (raw sockets, binary frames) and ``rpc`` (torch.distributed.rpc)."""
