"""A sweep's options know its workload (controller/sweep/options.py): one kind of model per session,
and a flag of the other workload's refused in one line that says what to give instead."""

from __future__ import annotations

import pytest

from paretopipe.errors import UsageError
from paretopipe.controller.sweep.options import SweepOptions, check_workload
from paretopipe.workload import GENERATION, IMAGES


def test_the_sweeps_workload_is_its_models():
    assert SweepOptions(models=["mobilenet_v2", "resnet18"]).workload is IMAGES
    assert SweepOptions(models=["tiny-lm"]).workload is GENERATION
    check_workload(SweepOptions(models=["tiny-lm"]))
    check_workload(SweepOptions(models=["mobilenet_v2", "resnet18"]))


@pytest.mark.parametrize("opts, why", [
    (SweepOptions(models=["mobilenet_v2", "tiny-lm"]),
     "--models mobilenet_v2,tiny-lm: a sweep measures language models or image models; sweep each kind in a "
     "session of its own"),
    (SweepOptions(models=["mobilenet_v2"], loadgen_settings={"ttft_bound_s": 0.5}),
     "--ttft-ms and --tpot-ms bound a language model's tokens; an image model's Server takes --latency-bound-ms"),
    (SweepOptions(models=["tiny-lm"], splits="2,adaptive"),
     "a language model runs static splits over its prompts: drop adaptive from --splits"),
    # each run refused it, after the sweep had started: "every run of 1 configuration failed twice"
    (SweepOptions(models=["mobilenet_v2"], eval_text="notes.txt"),
     "--eval-text is a language model's evaluation text; for an image model's, use --eval-samples of its "
     "--dataset"),
])
def test_the_other_workloads_options_are_refused_in_one_line(opts, why):
    with pytest.raises(UsageError) as caught:
        check_workload(opts)
    assert str(caught.value) == why
