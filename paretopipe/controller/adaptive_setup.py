"""The adaptive split for one model: the :class:`~paretopipe.predict.adaptive_policy.AdaptivePolicy` that
stage 1's driver (``transport.tcp.source``) consults before each batch.

What the driver does with it, per batch (one batch in flight, so a switch falls between two):

1. with no stage 2, it looks for a new one on the listener (RUN replayed; the policy's next
   choice is free);
2. the policy picks a split from the device profiles and the smoothed link estimate; the driver
   announces a change with SWITCH before the batch's frame;
3. the driver runs stage 1's part, sends it and waits for the result up to the deadline; if it does
   not come (stage 2 died, or the deadline passed) it finishes the batch here from the activation
   already computed and marks it ``served_locally``; a late result is dropped by its sequence number;
4. the batch's network time (stage 2's reported work taken out) goes back to the policy, which
   asks for a PROBE between batches when the split's frames cannot show the rate (or a ping when
   they cannot show the RTT); probes are outside every batch's latency, inside the run's wall time.

This module adds what needs the model: the candidates' cuts and bytes, and the self-profiles
(this node's segment times beside the ones stage 2 sent with RUN_OK) when no device profiles are
given. Every figure in the record is measured on stage 1's clock.
"""

from __future__ import annotations

import logging
from typing import Any

from ..errors import UsageError, WireError
from ..partition.stages import StageBuilder
from ..splitspec import SCIOT, check_splits, is_cut_name
from ..predict.adaptive_policy import AdaptivePolicy, Candidate, SciotPolicy, VarianceSettings, self_profile
from ..predict.device_profile import DeviceProfile, check_compatible, codec_key
from ..transport import tcp
from ..transport.runconfig import RunConfig

log = logging.getLogger("paretopipe.adaptive")


def check_candidates(builder: StageBuilder, candidates: list[Candidate]) -> None:
    """Refuse, by name, a block split out of range or a cut the model does not have."""
    part = builder.partitioner
    check_splits([c for c in candidates if isinstance(c, int)], part.num_blocks, builder.name,
                 "adaptive candidate split")
    known = {c.name for c in part.fine_cuts}
    for c in candidates:
        if isinstance(c, str) and (not is_cut_name(c) or c not in known):
            raise UsageError(f"adaptive candidate {c!r} is not a cut of {builder.name}; "
                             f"python -m paretopipe.split --model {builder.name} --list --fine names them")


def adaptive_policy(builder: StageBuilder, cfg: RunConfig) -> AdaptivePolicy:
    """The policy of adaptive run ``cfg``: its candidates (every block split unless it names them),
    each one's cut, and the device profiles it chooses with."""
    part = builder.partitioner
    num_blocks = part.num_blocks
    block_cuts = part.block_cuts()
    opts = cfg.adaptive_split
    candidates: list[Candidate] = list(opts.candidates) if opts.candidates is not None else list(range(num_blocks + 1))
    check_candidates(builder, candidates)
    if cfg.cuts[0] not in block_cuts:
        raise UsageError(f"an adaptive run starts at a block split, not {cfg.cuts[0]!r}")
    cut_of: dict[Candidate, str] = {k: cut for k, cut in enumerate(block_cuts)}
    cut_of.update({c: c for c in candidates if isinstance(c, str)})
    notes: dict[str, Any] = {"self_profiles": None, "device_profiles": opts.device_profiles}

    def profiles_from(remote: dict[str, Any]) -> list[DeviceProfile]:
        if opts.device_profiles:
            profiles = [DeviceProfile.load(p) for p in opts.device_profiles]
            for w in check_compatible(profiles, builder.name):
                log.warning("adaptive: %s", w)
            return profiles
        if "profile" not in remote:
            raise WireError("stage 2 sent no self-profile with RUN_OK (is it an older ParetoPipe?)")
        mine = tcp.self_profile_timings(builder, cfg)
        policy.notes["self_profiles"] = {"stage1": mine, "stage2": remote["profile"]}
        names = tcp.self_profile_cuts(builder, cfg)
        bytes_per_image = [part.payload_nbytes(c, 1) for c in names]
        at_block = {names.index(cut): k for k, cut in enumerate(block_cuts)}
        labels = [f"k{at_block[i]}" if i in at_block else cut for i, cut in enumerate(names)]
        blocks = {k: i for i, k in at_block.items()}
        return [self_profile(builder.name, cfg.batch_size, t, bytes_per_image, role, labels, blocks)
                for role, t in (("stage1", mine), ("stage2", remote["profile"]))]

    variance = VarianceSettings(ema_alpha=opts.ema_alpha, cv_threshold=opts.cv_threshold, window=opts.window)
    common = dict(batch_size=cfg.batch_size, objective=opts.objective, codec=codec_key(cfg.wire_dtype, cfg.compression),
                  summary=notes, segments=tcp.self_profile_cuts(builder, cfg), variance=variance, seed=cfg.seed,
                  given_profiles=bool(opts.device_profiles))
    if cfg.split_index == SCIOT:
        policy = SciotPolicy(cut_of, candidates, num_blocks, profiles_from, local_probability=opts.local_probability,
                             **common)
    else:
        policy = AdaptivePolicy(cut_of, candidates, num_blocks, profiles_from, **common)
    return policy
