"""Energy and memory of a stage: the power sensors a host has, a sampler that integrates them over
a run's measured window, the modelled figure where no sensor exists, and peak memory.

Torch-free (part of the base layer): a stage reads its sensors with plain file reads, NVML and
``vcgencmd``; :mod:`paretopipe.partition.stages` counts a stage module's own bytes.
"""
