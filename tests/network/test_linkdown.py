"""link:down on a link tc shapes: golden commands, and a real outage on a namespace lab's veth
(a queue of no room drops the data port both ways; the connection lives through it)."""

from __future__ import annotations

import json
import subprocess

import pytest

from conftest import PYTHON
from paretopipe.network import tc, tctree
from paretopipe.network.conditions import get_conditions, load_conditions
from paretopipe.network.linkdown import LinkDown, ShapedEgress, down_commands, up_commands


def test_a_shaped_link_goes_down_by_its_leaf_queue_and_comes_back_as_it_was():
    p = get_conditions(None, rate="20mbit").up
    assert [str(c) for c in down_commands("eth0", p, port=5299)] == [
        "tc qdisc replace dev eth0 parent 1:2 handle 20: pfifo limit 0"]
    assert [str(c) for c in up_commands("eth0", p)] == [
        "tc qdisc replace dev eth0 parent 1:2 handle 20: pfifo limit 10000"]
    lte = load_conditions()["lte"].up  # delay too: its queue is netem's, as apply made it
    assert [str(c) for c in up_commands("eth0", lte)] == [str(tctree.apply_commands(lte, "eth0", port=5299)[4])]


def test_an_unshaped_link_gets_a_tree_to_go_down_and_loses_it_when_back():
    lan = load_conditions()["lan"].up
    got = [str(c) for c in down_commands("eth0", lan, port=5299)]
    assert got[:4] == [str(c) for c in tctree.egress_commands("eth0", lan, tctree.Match(5299))][:4]
    assert "dport 5299 0xffff flowid 1:2" in " ".join(got) and "sport 5299 0xffff flowid 1:2" in " ".join(got)
    assert got[-1] == "tc qdisc replace dev eth0 parent 1:2 handle 20: pfifo limit 0"
    assert [str(c) for c in up_commands("eth0", lan)] == [str(c) for c in tctree.clear_commands("eth0", ingress=False)]


ECHO = '''
import socket, sys
srv = socket.create_server((sys.argv[1], int(sys.argv[2])))
print("listening", flush=True)
conn, _ = srv.accept()
while data := conn.recv(1):
    conn.sendall(data)
'''

CLIENT = '''
import socket, sys
conn = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=5)
for line in sys.stdin:
    what, wait = line.split()
    if what != "-":
        conn.sendall(what.encode())
    conn.settimeout(float(wait))
    try:
        print(conn.recv(1).decode(), flush=True)
    except TimeoutError:
        print("timeout", flush=True)
'''


@pytest.mark.root
@pytest.mark.lab
def test_a_link_taken_down_carries_nothing_either_way_and_its_connection_lives_on(tmp_path):
    from lab_helpers import lab

    (tmp_path / "echo.py").write_text(ECHO)
    (tmp_path / "client.py").write_text(CLIENT)
    rate = get_conditions(None, rate="50mbit")
    with lab("pplo", 2, subnet=68) as made:
        hosts = [tc.Runner(netns=made.namespace(i)) for i in (1, 2)]
        echo = subprocess.Popen(["ip", "netns", "exec", made.namespace(2), PYTHON, str(tmp_path / "echo.py"),
                                 made.address(2), "5299"], stdout=subprocess.PIPE, text=True)
        client = None
        try:
            assert echo.stdout.readline().strip() == "listening"
            client = subprocess.Popen(["ip", "netns", "exec", made.namespace(1), PYTHON, str(tmp_path / "client.py"),
                                       made.address(2), "5299"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                      text=True, bufsize=1)

            def ask(what: str, wait: float) -> str:
                client.stdin.write(f"{what} {wait}\n")
                return client.stdout.readline().strip()

            with tc.applied(rate.up, "eth0", runner=hosts[0], port=5299), \
                    tc.applied(rate.down, "eth0", runner=hosts[1], port=5299):
                link = LinkDown([ShapedEgress(h, "eth0", d, 5299) for h, d in zip(hosts, (rate.up, rate.down))])
                assert ask("a", 5) == "a"
                link.down()
                assert ask("b", 1.5) == "timeout"  # nothing gets through while it is down
                leaf = [q for q in tc.show("eth0", hosts[0]) if q["kind"] == "pfifo"]
                assert leaf and leaf[0]["options"]["limit"] == 0
                stats = json.loads(subprocess.run(["ip", "netns", "exec", made.namespace(1), "tc", "-s", "-j", "qdisc",
                                                   "show", "dev", "eth0"], capture_output=True, text=True).stdout)
                assert sum(q.get("drops", 0) for q in stats if q["kind"] == "pfifo") >= 1
                link.up()
                assert ask("-", 15) == "b"  # TCP sends it again once the queue is back: nothing lost
                assert ask("c", 5) == "c"
                assert [q["options"]["limit"] for q in tc.show("eth0", hosts[0]) if q["kind"] == "pfifo"] == [10000]
        finally:
            for proc in (client, echo):
                if proc is not None:
                    proc.kill()
                    proc.wait(10)
