"""A run that named no network is labelled by what its manifest recorded: the link as it is, or
the tc tree read back by its parameters (iproute2's tc -j: netem times in seconds, loss as a
fraction, htb rates as tc class show prints them)."""

from __future__ import annotations

import pytest

from paretopipe.network.labels import UNSHAPED, link_label

#: What observed_link_state reads back from network_delay.py's tree for 20 ms +- 5 ms, 0.5% loss at
#: 10 Mbit/s (the shape of `tc -j qdisc show` on a kernel with netem; golden, netem is absent here).
NETEM_TREE = {"mode": "tc", "dev": "eth0", "host": "local",
              "qdiscs": [{"kind": "htb", "handle": "1:", "parent": "root", "root": True,
                          "options": {"r2q": 10, "default": "0x1"}},
                         {"kind": "netem", "handle": "20:", "parent": "1:2", "root": False,
                          "options": {"limit": 1000, "delay": {"delay": 0.02, "jitter": 0.005, "correlation": 0},
                                      "loss-random": {"loss": 0.005, "correlation": 0}, "ecn": False, "gap": 0}}],
              "classes": [{"kind": "htb", "class": "1:1", "parent": "1:", "leaf": None, "rate": "10Gbit",
                           "ceil": "10Gbit"},
                          {"kind": "htb", "class": "1:2", "parent": "1:", "leaf": "20:", "rate": "10Mbit",
                           "ceil": "10Mbit"}]}


@pytest.mark.parametrize("link,label", [
    ({"mode": "none", "note": "no shaping by this run"}, UNSHAPED),
    (None, UNSHAPED),
    ({"mode": "emulated", "conditions": {"name": "lte"}}, "lte"),
    (NETEM_TREE, "tc-rate10mbit-delay20ms-jitter5ms-loss0p5pct"),
    ({**NETEM_TREE, "qdiscs": NETEM_TREE["qdiscs"][:1]}, "tc-rate10mbit"),
    ({**NETEM_TREE, "classes": [{**c, "rate": "10Gbit"} for c in NETEM_TREE["classes"]], "qdiscs": []}, "tc-unshaped"),
    ({"mode": "tc", "qdiscs": [{"kind": "tbf", "options": {"rate": 1_250_000}}], "classes": []}, "tc-rate10mbit"),
])
def test_link_labels(link, label):
    assert link_label(link) == label
