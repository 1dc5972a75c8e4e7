"""A testbed from .env: one value for every host, or one per host (REMOTE_DIRS, REMOTE_PYTHONS,
DEVICES) for a mixed testbed such as a Pi beside an x86 server; every value reaches the remote
shell line quoted."""

from __future__ import annotations

import shlex

from paretopipe.runners import hosts

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
    line = tb.hosts[0].shell_line("paretopipe.runners.hostcheck", ["--models", "mobilenetv2"])
    words = shlex.split(line)
    assert words[words.index("exec") + 1] == "/opt/arm python/bin/python3"
    assert words[-4:] == ["-m", "paretopipe.runners.hostcheck", "--models", "mobilenetv2"]
