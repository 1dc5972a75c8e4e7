"""A testbed from .env: one value for every host, or one per host (REMOTE_DIRS, REMOTE_PYTHONS,
DEVICES) for a mixed testbed such as a Pi beside an x86 server; every value reaches the remote
shell line quoted."""

from __future__ import annotations

import shlex

from paretopipe.controller import hosts

BASE = {"HOSTS": "10.0.0.1,10.0.0.2,10.0.0.3", "REMOTE_DIR": "/srv/pp", "REMOTE_PYTHON": "/srv/pp/.venv/bin/python"}


def test_per_host_values_override_the_shared_ones_and_missing_ones_fall_back():
    tb = hosts.Testbed.from_env({**BASE, "REMOTE_PYTHONS": "/opt/arm python/bin/python3,,/usr/bin/python3",
                                 "REMOTE_DIRS": ",/home/pi/pp", "DEVICES": "cpu,cuda"})
    assert [h.remote_python for h in tb.hosts] == ["/opt/arm python/bin/python3", "/srv/pp/.venv/bin/python",
                                                   "/usr/bin/python3"]
    assert [h.remote_dir for h in tb.hosts] == ["/srv/pp", "/home/pi/pp", "/srv/pp"]  # an empty entry keeps its place
    assert [h.device for h in tb.hosts] == ["cpu", "cuda", "cpu"]


def test_a_per_host_python_is_one_quoted_word_of_the_remote_shell_line():
    tb = hosts.Testbed.from_env({**BASE, "REMOTE_PYTHONS": "/opt/arm python/bin/python3"})
    line = tb.hosts[0].shell_line("paretopipe.controller.hostcheck", ["--models", "mobilenetv2"])
    words = shlex.split(line)
    assert words[words.index("exec") + 1] == "/opt/arm python/bin/python3"
    assert words[-4:] == ["-m", "paretopipe.controller.hostcheck", "--models", "mobilenetv2"]


def test_commands_to_a_host_share_one_connection_in_a_folder_of_this_users_alone(tmp_path, monkeypatch):
    import os
    import tempfile

    from paretopipe import sshcmd

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    host = hosts.Testbed.from_env({**BASE, "SSH_USER": "pi", "SSH_KEY": "/keys/pi"}).hosts[0]
    argv = host.ssh()
    path = argv[argv.index("ControlMaster=auto") + 2].split("=", 1)[1]
    folder = tmp_path / f"paretopipe-ssh-{os.getuid()}"
    assert os.path.dirname(path) == str(folder) and folder.stat().st_mode & 0o777 == 0o700
    assert argv[-2:] == ["--", "pi@10.0.0.1"] and f"ControlPersist={sshcmd.PERSIST_S}" in argv
    # Port 22 is the default one; another key, host or port is another connection.
    assert sshcmd.control_path("pi@10.0.0.1", "/keys/pi", 22) == path
    assert len({sshcmd.control_path(*args) for args in (("pi@10.0.0.1", "/keys/other"), ("pi@10.0.0.2", "/keys/pi"),
                                                         ("pi@10.0.0.1", "/keys/pi", 2222))} - {path}) == 3
    assert not sshcmd.close_shared("pi@10.0.0.1", "/keys/pi")  # none open: nothing to end
    monkeypatch.setenv(sshcmd.SHARE_ENV, "0")
    assert not any(a.startswith("Control") for a in host.ssh())
    monkeypatch.delenv(sshcmd.SHARE_ENV)
    folder.chmod(0o777)  # a folder others can write: their socket could stand in for ours
    assert not any(a.startswith("Control") for a in host.ssh())
