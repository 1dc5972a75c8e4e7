"""Named network conditions: per-direction values, UP/DOWN ad-hoc values, the file's checks."""

from __future__ import annotations

import pytest

from paretopipe.errors import UsageError
from paretopipe.network.conditions import Direction, NetworkConditions, get_conditions, load_conditions


def test_suffixed_keys_make_asymmetric_conditions(tmp_path):
    f = tmp_path / "p.toml"
    f.write_text('[cell]\ndelay = "30ms"\nrate_up = "768kbit"\nrate_down = "1600kbit"\nloss_down = "1%"\n')
    c = load_conditions(f)["cell"]
    assert c.up == Direction(delay_s=0.030, rate_bps=768e3)
    assert c.down == Direction(delay_s=0.030, rate_bps=1.6e6, loss_percent=1.0)
    assert not c.symmetric and "up delay 30ms, rate 768kbit; down" in c.describe()
    assert NetworkConditions.from_dict(c.to_dict()) == NetworkConditions("cell", c.up, c.down)


def test_adhoc_up_down_values_and_overrides():
    c = get_conditions(None, rate="768kbit/1600kbit", delay="20ms")
    assert (c.up.rate_bps, c.down.rate_bps, c.up.delay_s, c.down.delay_s) == (768e3, 1.6e6, 0.02, 0.02)
    lte = get_conditions("lte", rate="1mbit")
    assert lte.name == "lte+custom" and lte.up.rate_bps == lte.down.rate_bps == 1e6 and lte.up.delay_s == 0.035


@pytest.mark.parametrize("text, message", [
    ('[x]\nbandwidth = "1mbit"\n', "unknown key 'bandwidth'"),
    ('[x]\nrate = "1mbps"\n', "bytes per second in tc"),
    ('[x]\ndistribution = "gamma"\njitter = "1ms"\n', "distribution 'gamma'"),
    ('x = 1\n', "'x' is not a table"),
    ('[x\n', "not valid TOML"),
])
def test_bad_files_are_one_clear_line(tmp_path, text, message):
    f = tmp_path / "p.toml"
    f.write_text(text)
    with pytest.raises(UsageError, match=message):
        load_conditions(f)


def test_direction_arithmetic():
    d = Direction(delay_s=0.05, rate_bps=10e6, loss_percent=1.0)
    assert d.serialise_s(1250) == pytest.approx(0.001)
    assert d.expected_lost_segments(1448 * 100) == pytest.approx(1.0)
    assert d.serialise_s(0, lost_segments=1) == pytest.approx(1448 * 8 / 10e6 + 0.1)
    assert Direction().expected_delay_s() == 0.0 and not Direction().is_shaped
