"""A run's energy and memory figures from its stages' parts: hand-computed joules per image,
measured and modelled apart, shared sensors counted once."""

from __future__ import annotations

import pytest

from paretopipe.energy.summary import summarize


def _stage(gross: float | None, idle_w: float = 2.0, window: float = 2.0, cpu: float = 1.5, images: int = 10,
           path: str = "/sys/class/powercap", peak: int = 900, params: int = 100, act: int = 20,
           limit: int | None = None) -> dict:
    energy = {"sensors": [{"name": "rapl", "path": path, "kind": "energy"}] if gross is not None else [],
              "rate_hz": 10.0, "idle_w": {"rapl": {"total": idle_w}} if gross is not None else {}}
    if gross is not None:
        energy["window"] = {"rapl": {"joules": {"total": gross, "dram": 1.0, "core": 3.0}, "samples": 21}}
    return {"memory": {"peak_rss_bytes": peak, "param_bytes": params, "activation_peak_bytes": act,
                       "limit_bytes": limit},
            "images": images, "window_s": window, "cpu_s": cpu, "energy": energy}


def test_measured_energy_is_net_of_idle_per_image_and_shared_sensors_count_once():
    hosts = [{"hostname": "pi"}, {"hostname": "server"}]
    out = summarize({"stage1": _stage(10.0), "stage2": _stage(30.0, idle_w=5.0)}, hosts, {})
    # stage 1: 10 J - 2 W x 2 s = 6 J over 10 images; stage 2: 30 J - 5 W x 2 s = 20 J.
    assert out["stage1_energy_per_image_j"] == pytest.approx(0.6)
    assert out["stage2_energy_per_image_j"] == pytest.approx(2.0)
    assert out["energy_per_image_j"] == pytest.approx(2.6)
    assert out["stage1_energy_dram_j"] == 1.0 and out["stage1_energy_cpu_j"] == 3.0
    assert out["stage1_energy_samples"] == 21 and out["energy_modelled_per_image_j"] is None
    # Both stages on one host read the same sensor: the pipeline counts it once.
    same = summarize({"stage1": _stage(10.0), "stage2": _stage(30.0)}, [{"hostname": "pi"}] * 2, {})
    assert same["energy_per_image_j"] == pytest.approx(0.6)


def test_a_device_that_drew_less_than_its_idle_gives_no_net_figure_and_says_why():
    # The H100's stage 2 in a sweep: idle measured at 124 W after its start-up, then 90 W on average
    # while it waited on an LTE link with its clocks down; 124 W x 2 s exceeds the 180 J it drew.
    out = summarize({"stage1": _stage(10.0), "stage2": _stage(180.0, idle_w=124.0)},
                    [{"hostname": "pi"}, {"hostname": "gpu"}], {})
    assert out["stage2_energy_per_image_j"] is None and out["stage2_energy_net_j"] is None
    assert out["stage2_energy_below_idle"] is True and out["stage1_energy_below_idle"] is False
    assert out["stage2_energy_mean_power_w"] == pytest.approx(90.0) and out["stage2_idle_power_w"] == 124.0
    assert out["stage2_energy_j"] == 180.0  # the gross joules stay
    assert out["energy_per_image_j"] is None  # the pipeline's figure needs every stage's
    assert out["stage1_energy_per_image_j"] == pytest.approx(0.6)


def test_modelled_energy_from_declared_powers_has_its_own_columns():
    out = summarize({"stage1": _stage(None, cpu=1.5), "stage2": _stage(None, cpu=0.5)}, [{}, {}],
                    {"power_idle_w": [2.7, 40.0], "power_core_w": [0.9, 15.0]})
    assert out["stage1_energy_modelled_per_image_j"] == pytest.approx(1.5 * 0.9 / 10)
    assert out["stage1_energy_modelled_j"] == pytest.approx(1.5 * 0.9 + 2.7 * 2.0)
    assert out["energy_modelled_per_image_j"] == pytest.approx((1.5 * 0.9 + 0.5 * 15.0) / 10)
    assert out["energy_per_image_j"] is None and "stage1_energy_per_image_j" not in out
    # A stage without declared powers leaves the pipeline's modelled figure out.
    partial = summarize({"stage1": _stage(None), "stage2": _stage(None)}, [{}, {}], {"power_core_w": [0.9, None]})
    assert partial["energy_modelled_per_image_j"] is None and "stage1_energy_modelled_per_image_j" in partial


def test_memory_per_stage_its_limit_and_the_largest_stage():
    out = summarize({"stage1": _stage(None, peak=900, params=100, act=20, limit=800),
                     "stage2": _stage(None, peak=700, params=500, act=5)}, [{}, {}], {"memory_limits": [None, 1000]})
    assert out["stage1_over_memory_limit"] is True and out["stage2_over_memory_limit"] is False
    assert out["memory_fits"] is False and out["memory_peak_bytes"] == 900
    assert (out["stage1_model_bytes"], out["stage2_model_bytes"], out["memory_model_bytes"]) == (120, 505, 505)
    assert summarize(None, [], {}) == {}


def test_the_links_modelled_energy_is_its_bits_each_way_at_the_declared_nanojoules():
    from paretopipe.energy.summary import link_energy
    from paretopipe.network.conditions import conditions_from_values

    net = conditions_from_values("wifi-e", {"rate": "50mbit", "energy_nj_per_bit_up": 100, "energy_nj_per_bit_down": 20,
                                            "energy_source": "a datasheet"})
    link = {"mode": "emulated", "conditions": net.to_dict()}
    out = link_energy(link, {"wire_bytes_mean": 200_000, "result_wire_bytes_mean": 80}, batch_size=2)
    assert out["link_energy_modelled_per_image_j"] == pytest.approx((200_000 * 8 * 100e-9 + 80 * 8 * 20e-9) / 2)
    assert out["link_energy_source"] == "a datasheet"
    assert link_energy({"mode": "none"}, {"wire_bytes_mean": 1}, 1) == {}
    # The conditions carry it through the manifest and back, and a constant without a source is refused.
    from paretopipe.errors import UsageError
    from paretopipe.network.conditions import NetworkConditions

    assert NetworkConditions.from_dict(net.to_dict()) == net
    assert conditions_from_values("x", net.to_values()) == net.__class__(**{**net.__dict__, "name": "x"})
    with pytest.raises(UsageError, match="energy_nj_per_bit needs energy_source"):
        conditions_from_values("x", {"energy_nj_per_bit": 100})
    with pytest.raises(UsageError, match="nanojoules per bit"):
        conditions_from_values("x", {"energy_nj_per_bit": -1, "energy_source": "s"})
