"""Which devices to use: every ordered subset after the data source priced by the planner, and what
each extra device buys or costs, against a brute-force enumeration and through the command."""

from __future__ import annotations

import json

import pytest

from conftest import PYTHON
from paretopipe.errors import UsageError
from paretopipe.predict import subsets
from paretopipe.predict.costmodel import LinkModel
from paretopipe.predict.device_profile import synthetic_profile
from paretopipe.predict.planner import brute_force_plans
import tcp_helpers as cli

SIZES = [int(6e5 * 0.75 ** i) for i in range(19)] + [4000]


def _profile(name: str, speed: float):
    return synthetic_profile([speed * 2e-3] * 19, SIZES, host=name)


def test_every_ordered_subset_after_the_source_is_a_placement():
    assert subsets.placements(3) == [(0, 1), (0, 2), (0, 1, 2), (0, 2, 1)]
    assert len(subsets.placements(4)) == 3 + 3 * 2 + 6 == 15
    for bad in (1, subsets.MAX_DEVICES + 1):
        with pytest.raises(UsageError, match="--subsets: give 2 to"):
            subsets.placements(bad)


def test_each_placements_best_plan_is_the_brute_force_optimum():
    profiles = [_profile("pi", 1.0), _profile("pi2", 1.0), _profile("server", 0.1)]
    up = down = LinkModel.of(rate_bps=20e6, delay_s=0.005)
    positions = list(range(20))
    for placed in subsets.price(profiles, up, down, 1, positions):
        chain = [profiles[i] for i in placed.devices]
        every = brute_force_plans(chain, [up] * (len(chain) - 1), 1, positions, back_links=[down] * (len(chain) - 1))
        assert placed.best("latency").latency_s == pytest.approx(min(p.latency_s for p in every))
        assert placed.best("throughput").throughput_imgs_per_s == pytest.approx(
            max(p.throughput_imgs_per_s for p in every))


def test_a_slow_extra_device_costs_latency_and_a_fast_one_buys_it():
    up = down = LinkModel.of(rate_bps=20e6, delay_s=0.005)
    positions = list(range(20))
    slow = subsets.price([_profile("pi", 1.0), _profile("slow", 4.0), _profile("server", 0.1)], up, down, 1, positions)
    rows = {(r["objective"], r["devices"]): r for r in subsets.marginal_gains(slow, ["pi", "slow", "server"])}
    assert rows[("latency", 2)]["placement"] == "pi -> server"
    # Every third device adds a hop's delay: the best of three is slower than pi -> server alone.
    assert rows[("latency", 3)]["gain"] == "loss" and rows[("latency", 3)]["vs_one_fewer"] > 1
    # Two Pis alone, then a server: the server buys latency and throughput.
    fast = subsets.price([_profile("pi", 1.0), _profile("pi2", 1.0)], up, down, 1, positions)
    both = subsets.price([_profile("pi", 1.0), _profile("pi2", 1.0), _profile("server", 0.1)], up, down, 1, positions)
    assert min(p.best("latency").latency_s for p in both) < fast[0].best("latency").latency_s


def test_the_command_prints_the_placements_and_writes_the_gains(tmp_path):
    paths = []
    for name, speed in (("pi", 1.0), ("slow", 4.0), ("server", 0.1)):
        path = tmp_path / f"{name}.json"
        path.write_text(json.dumps(_profile(name, speed).doc))
        paths.append(str(path))
    out = cli.run([PYTHON, "-m", "paretopipe", "predict", "--model", "mobilenetv2", "--device-profiles", ",".join(paths),
                   "--network", "wifi", "--subsets", "--out", str(tmp_path / "pred")], timeout=120)
    assert out.returncode == 0, out.stderr
    assert "4 placements, pi the data source" in out.stdout and "pi -> server -> slow" in out.stdout
    assert "3 devices" in out.stdout and "the extra device costs" in out.stdout
    rows = (tmp_path / "pred" / "subsets.csv").read_text().splitlines()
    assert rows[0].startswith("network,objective,devices,placement,value") and len(rows) == 1 + 4
    bad = cli.run([PYTHON, "-m", "paretopipe", "predict", "--model", "mobilenetv2", "--device-profiles",
                   ",".join(paths), "--links", "wifi,lte", "--subsets"], timeout=120)
    assert bad.returncode == 2 and "--subsets prices every hop over --network's conditions" in bad.stderr
