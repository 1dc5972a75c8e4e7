"""Running experiments: stage worker processes, hosts (local or over SSH), the RPC ranks, the sweep."""
