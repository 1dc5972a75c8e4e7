"""The sweeper: model x split x network x backend x run, resumable, with consolidated outputs.

Stage processes start once per model and backend (locally, each pinned to its own cores, or on
the testbed's hosts over SSH) and re-partition in place for every configuration. With ``--link
tc`` each host shapes its own egress (stage 1's host the up direction, the last stage's host the
down direction), only for the sweep's traffic. A configuration that fails is recorded, retried
once on fresh processes, and the sweep goes on; the exit status then says how many failed. Every
file is written atomically, so killing the sweep loses at most the configuration in flight, and
``--resume`` finishes what is missing. A full disk stops the sweep at once, never retried.

One module per concern, in the order a sweep uses them:

- :mod:`.options`: the sweep's options and the combinations refused before anything starts;
- :mod:`.plan`: what runs, in what order (pure: options and the model's shape in, planned runs out);
- :mod:`.group`: what the sweep asks of the processes that run its stages, and what they report;
- :mod:`.configure`: one planned run's typed configuration and its deadline (pure);
- :mod:`.shaping`: ``--link tc`` on the hosts for a stretch of runs of one network;
- :mod:`.drift`: the reference re-measured while a group runs, and the runs measured again;
- :mod:`.ledger`: what the sweep keeps (every record written atomically, failures, stopping
  decisions, time measured, runs.csv and session.json consolidated);
- :mod:`.sweeper`: the loop (rounds, retries, resuming).
"""

from .group import GroupFactory, GroupInfo, GroupPass, StageGroup
from .options import BACKENDS, LINKS, SweepOptions, check_options
from .plan import PlannedRun, describe_plan
from .ledger import DiskFullError
from .sweeper import INFEASIBLE, Sweeper, SweepResult

__all__ = ["BACKENDS", "INFEASIBLE", "LINKS", "DiskFullError", "GroupFactory", "GroupInfo", "PlannedRun",
           "StageGroup", "SweepOptions", "SweepResult", "Sweeper", "check_options", "describe_plan", "GroupPass"]
