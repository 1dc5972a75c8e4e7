"""Each transport beside its raw-TCP twin, per split, from a front table."""

from __future__ import annotations

import pandas as pd
import pytest

from paretopipe.analysis.transport_cost import format_transport_cost, transport_cost


def _row(transport: str, k: int, latency: float, throughput: float, on_front: bool, cipher: str = "none") -> dict:
    return {"model": "m", "backend": "tcp", "cipher": cipher, "transport": transport, "network": "lan",
            "batch_size": 1, "split_index": k, "latency_s": latency, "throughput_imgs_per_s": throughput,
            "on_front": on_front, "status": "complete"}


def test_each_transport_is_set_beside_its_tcp_twin_and_says_where_it_moves_the_front():
    table = pd.DataFrame([_row("tcp", 3, 0.10, 50, True), _row("tcp", 9, 0.20, 40, False),
                          _row("mqtt", 3, 0.15, 30, False), _row("mqtt", 9, 0.21, 39, True),
                          _row("websocket", 3, 0.11, 48, True),
                          _row("mqtt", 3, 0.5, 5, True, cipher="aesgcm")])  # no sealed TCP twin: left out
    cost = transport_cost(table)
    assert list(zip(cost["transport"], cost["split_index"])) == [("mqtt", "3"), ("mqtt", "9"), ("websocket", "3")]
    mqtt3 = cost.iloc[0]
    assert mqtt3["latency_ratio"] == pytest.approx(1.5) and mqtt3["throughput_ratio"] == pytest.approx(0.6)
    assert (bool(mqtt3["on_front"]), bool(mqtt3["on_front_tcp"])) == (False, True)  # MQTT moves k=3 off
    assert (bool(cost.iloc[1]["on_front"]), bool(cost.iloc[1]["on_front_tcp"])) == (True, False)  # ...and k=9 on
    text = format_transport_cost(cost)
    assert "What each transport costs per split" in text and "x1.500" in text and "off (tcp: on)" in text


def test_a_session_over_tcp_alone_or_from_before_transports_has_no_transport_cost():
    plain = pd.DataFrame([_row("tcp", 3, 0.1, 50, True)])
    assert transport_cost(plain).empty and transport_cost(plain.drop(columns=["transport"])).empty
    assert format_transport_cost(transport_cost(plain)) == ""
