"""Peak memory, measured for real on this machine's /proc, and memory limits as users write them."""

from __future__ import annotations

import mmap

import pytest

from paretopipe.energy import memory
from paretopipe.errors import UsageError
from paretopipe.transport.resources import ResourceMeter


def test_a_run_that_holds_200_mb_more_shows_it_within_10_percent():
    def run(extra_mb: int) -> int:
        meter = ResourceMeter("cpu", 10.0).start()  # resets the high-water mark to the RSS now
        # Pages of a mapping of its own: malloc may serve 200 MB from free heap pages an earlier
        # test on this worker left resident, which would not raise the RSS at all.
        with mmap.mmap(-1, max(extra_mb << 20, mmap.PAGESIZE)) as held:
            for offset in range(0, extra_mb << 20, mmap.PAGESIZE):  # touch every page: resident, not just reserved
                held[offset] = 1
            meter.stop()
            return meter.part(1)["memory"]["peak_rss_bytes"]

    base, more = run(0), run(200)
    assert memory.reset_peak_rss()
    assert (more - base) == pytest.approx(200 << 20, rel=0.10)


def test_vgg16_first_and_last_stage_parameters_add_up_to_the_whole_model():
    from paretopipe.partition.stages import StageBuilder

    b = StageBuilder("vgg16")
    whole = sum(t.numel() * t.element_size() for t in (*b.model.parameters(), *b.model.buffers()))
    K = b.partitioner.num_blocks
    for k in (0, K):
        cuts = b.cuts_for(k)
        parts = [b.stage_bytes(cuts, i, 1)["param_bytes"] for i in (0, 1)]
        assert sum(parts) == whole and sorted(parts) == [0, whole]
    # and at an inner split each side holds its own share
    cuts = b.cuts_for(K // 2)
    assert sum(b.stage_bytes(cuts, i, 1)["param_bytes"] for i in (0, 1)) == whole


@pytest.mark.parametrize("text, want", [("1GiB", 1 << 30), ("512MiB", 512 << 20), ("2GB", 2_000_000_000),
                                        ("1.5G", int(1.5 * (1 << 30))), ("4096", 4096)])
def test_sizes(text, want):
    assert memory.parse_size(text) == want


def test_limits_per_stage_and_refusals():
    assert memory.parse_limits("stage1=1GiB", 2) == {"stage1": 1 << 30}
    assert memory.parse_limits("1GiB,8GiB", 2) == {"stage1": 1 << 30, "stage2": 8 << 30}
    for bad, why in (("1GiB", "one size per stage"), ("edge=1GiB", "name a stage"), ("stage3=1G", "name a stage"),
                     ("stage1=lots", "give a size"), ("stage1=0", "must be positive")):
        with pytest.raises(UsageError, match=why):
            memory.parse_limits(bad, 2)
