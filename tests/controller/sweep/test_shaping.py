"""Which hops of a pipeline ``--link tc`` shapes, as the record names them: the data port's, or
with MQTT the hops through the broker wherever it runs (the lab test shapes them for real)."""

from __future__ import annotations

from paretopipe.controller.hosts import Host
from paretopipe.controller.sweep.shaping import shaped_hops, unshaped_hops

PI, SERVER, BROKER = Host("10.0.0.1"), Host("10.0.0.2"), Host("10.0.0.3")


def test_a_broker_on_a_third_machine_leaves_its_deliveries_unshaped_and_says_so():
    hosts = [(PI, "up"), (SERVER, "down")]
    broker = (BROKER.address, 1883)
    assert shaped_hops(PI, 0, 1883, broker) == ["stage1 → broker 10.0.0.3:1883"]
    assert shaped_hops(SERVER, 1, 1883, broker) == ["stage2 → broker 10.0.0.3:1883"]
    assert unshaped_hops(hosts, broker) == ["broker 10.0.0.3:1883 → every stage (the broker's host is not a stage host)"]


def test_a_broker_beside_stage1_shapes_its_deliveries_on_stage1s_nic():
    hosts = [(PI, "up"), (SERVER, "down")]
    broker = (PI.address, 1883)
    assert shaped_hops(PI, 0, 1883, broker) == ["broker 10.0.0.1:1883 → the stages on other hosts"]
    assert shaped_hops(SERVER, 1, 1883, broker) == ["stage2 → broker 10.0.0.1:1883"]
    assert unshaped_hops(hosts, broker) == ["stage1 ↔ broker (the same host: loopback)"]


def test_without_a_broker_each_host_shapes_its_own_stages_frames():
    assert shaped_hops(PI, 0, 5555, None) == ["stage1's frames"]
    assert shaped_hops(None, 0, 5555, None) == ["every stage's frames on this machine"]
    assert unshaped_hops([(PI, "up"), (SERVER, "down")], None) == []
    # One machine with a broker: every hop crosses the shaped interface, twice per frame.
    assert "shaped twice" in shaped_hops(None, 0, 1883, ("127.0.0.1", 1883))[0]
    assert unshaped_hops([(None, None)], ("127.0.0.1", 1883)) == []
