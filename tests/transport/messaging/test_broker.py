"""The Mosquitto broker the project starts for MQTT runs: real processes, real files."""

from __future__ import annotations

import shutil
import socket
from pathlib import Path

import pytest

from paretopipe.errors import ParetoPipeError
from paretopipe.transport.messaging.broker import Broker, mosquitto_binary

pytestmark = pytest.mark.skipif(mosquitto_binary() is None, reason="no mosquitto here (make installs it)")


def test_the_broker_keeps_no_clear_password_confines_each_user_and_leaves_nothing_behind():
    broker = Broker(users=("stage1", "stage2"), others={"guest": "elsewhere"})
    folder, process = broker.folder, broker.process
    try:
        stored = (folder / "passwd").read_text()
        assert all(pw not in stored for pw in broker.passwords.values())  # hashed by mosquitto_passwd
        acl = (folder / "acl").read_text()
        assert f"user stage1\ntopic readwrite {broker.namespace}/#" in acl
        assert "user guest\ntopic readwrite elsewhere/#" in acl
        assert "allow_anonymous false" in (folder / "mosquitto.conf").read_text()
        env = broker.env_lines("stage2")
        assert f"MQTT_BROKER=127.0.0.1:{broker.port}\nMQTT_USERNAME=stage2\n" in env
        assert broker.settings("guest").namespace == "elsewhere"
        with socket.create_connection(("127.0.0.1", broker.port), timeout=2):
            pass
    finally:
        broker.stop()
    assert process.poll() is not None and not folder.exists()


def test_a_port_in_use_is_one_line_with_the_brokers_own_words():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        with pytest.raises(ParetoPipeError, match=f"Mosquitto did not start on 127.0.0.1:{port}: .*"):
            Broker(port=port, startup_timeout=5)


def test_a_drawn_port_another_program_takes_before_the_bind_is_drawn_again(monkeypatch):
    """The port is drawn, then bound by Mosquitto: a listener that takes it in between (another
    test's server, here) makes Mosquitto exit with "Address already in use", and the broker
    draws a new port and starts there; a port the caller chose is never swapped."""
    from paretopipe.transport.messaging import broker as broker_module

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        draws = [taken.getsockname()[1]]
        real_draw = broker_module._free_port
        monkeypatch.setattr(broker_module, "_free_port", lambda host: draws.pop(0) if draws else real_draw(host))
        broker = Broker()
        try:
            assert broker.port != taken.getsockname()[1] and broker.process.poll() is None
            with socket.create_connection(("127.0.0.1", broker.port), timeout=2):
                pass
        finally:
            broker.stop()


def test_a_broker_stops_when_the_process_that_started_it_is_killed(tmp_path):
    import signal
    import subprocess
    import sys
    import time

    script = ("import sys, time\nfrom paretopipe.transport.messaging.broker import Broker\n"
              "b = Broker()\nprint(b.process.pid, b.folder, flush=True)\ntime.sleep(60)\n")
    owner = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    pid, folder = owner.stdout.readline().split()
    owner.send_signal(signal.SIGKILL)  # no chance to stop it itself
    owner.wait(10)
    deadline = time.monotonic() + 10
    while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    try:
        assert not Path(f"/proc/{pid}").exists() or "zombie" in Path(f"/proc/{pid}/status").read_text().lower()
    finally:
        shutil.rmtree(folder, ignore_errors=True)  # what its killed owner could not remove


def test_paretopipe_broker_prints_each_stages_env_serves_them_and_ends_clean_on_ctrl_c():
    import signal
    import subprocess
    import threading

    from conftest import PYTHON, ROOT
    from paretopipe.transport import messaging
    from paretopipe.transport.messaging.mqtt import MqttSettings
    from tcp_helpers import free_port

    port = free_port()
    proc = subprocess.Popen([PYTHON, "-m", "paretopipe", "broker", "--port", str(port), "--stages", "2"], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        lines = []
        while "broker running" not in (line := proc.stdout.readline()):
            assert line, proc.stderr.read()
            lines.append(line)
        env = {}
        for block in "".join(lines).split("# .env of ")[1:]:
            user, _, rest = block.partition("\n")
            env[user] = dict(kv.split("=", 1) for kv in rest.split() if "=" in kv)
        assert sorted(env) == ["stage1", "stage2"] and env["stage1"]["MQTT_BROKER"] == f"127.0.0.1:{port}"
        # the printed lines are what each stage's .env needs: a message goes from stage 2 to stage 1
        spec = {u: messaging.TransportSpec("mqtt", MqttSettings.from_env(e)) for u, e in env.items()}
        listener = messaging.listen(spec["stage1"], "127.0.0.1", 5555, 1 << 20)
        try:
            dialled = []
            dialler = threading.Thread(target=lambda: dialled.append(
                messaging.connect(spec["stage2"], "127.0.0.1", 5555, 10.0, 1 << 20)))
            dialler.start()
            listener.settimeout(10.0)
            served, _ = listener.accept()
            served.sendall(b"hello")  # the dialler's open completes when the listening stage speaks
            dialler.join(10.0)
            sender = dialled[0]
            assert sender.recv(5) == b"hello"
            sender.sendall(b"frame")
            assert served.recv(5) == b"frame"
            sender.close()
            served.close()
        finally:
            listener.close()
    finally:
        proc.send_signal(signal.SIGINT)
        assert proc.wait(20) == 0
