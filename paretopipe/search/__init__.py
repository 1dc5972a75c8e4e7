"""Multi-objective search over configuration spaces too large to sweep (issue: fronts from a
fraction of the runs).

- :mod:`.space`: a space of categorical and ordered dimensions (a plan's cuts, codec, batch
  size, ...), its configurations, and a lookup table that replays a space measured or modelled
  in full;
- :mod:`.samplers`: the Optuna samplers a search may use, by name;
- :mod:`.loop`: the ask-and-tell loop over a budget of configurations, seeded by a predicted
  front, each configuration measured once, and the hypervolume reached after each.
"""
