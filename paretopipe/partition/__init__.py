"""Partitioning: the model zoo and its deterministic weights, fx cut points, stage modules, stage timing."""
