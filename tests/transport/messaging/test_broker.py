"""The Mosquitto broker the project starts for MQTT runs: real processes, real files."""

from __future__ import annotations

import socket

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
