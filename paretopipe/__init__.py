"""ParetoPipe: Pareto-front benchmarking of pipeline-parallel (split) DNN inference."""

__version__ = "0.1.0"
