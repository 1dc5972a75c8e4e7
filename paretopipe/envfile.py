"""Reading ``.env``: KEY=VALUE pairs with python-dotenv (never executed), overridden by the environment."""

from __future__ import annotations

import os

from .errors import UsageError

#: The .env keys this project reads (everything else in a .env is ignored).
ENV_KEYS = ("PI1_IP", "PI2_IP", "GPU_IP", "HOSTS", "SSH_USER", "SSH_KEY", "SSH_PORT", "SSH_KNOWN_HOSTS",
            "REMOTE_DIR", "REMOTE_DIRS", "REMOTE_PYTHON", "REMOTE_PYTHONS", "PORT", "IFACE", "PI1_DEVICE",
            "PI2_DEVICE", "GPU_DEVICE", "DEVICES",
            "MASTER_ADDR", "MASTER_PORT", "GLOO_SOCKET_IFNAME", "TP_SOCKET_IFNAME", "PARETOPIPE_SECRET",
            "MQTT_BROKER", "MQTT_USERNAME", "MQTT_PASSWORD", "MQTT_NAMESPACE")


def read_env(path: str | None) -> dict[str, str]:
    """KEY=VALUE pairs of a ``.env`` file (quotes and inline comments handled as a shell would
    read them, nothing executed), overridden by the same keys in the environment. A missing file
    is an empty one."""
    from dotenv import dotenv_values

    values: dict[str, str] = {}
    if path and os.path.isfile(path):
        try:
            values = {k: v for k, v in dotenv_values(path).items() if v is not None and k in ENV_KEYS}
        except (OSError, UnicodeDecodeError) as exc:
            raise UsageError(f"cannot read {path}: {exc}")
    elif path and os.path.exists(path):
        raise UsageError(f"--env-file {path} is not a file")
    values.update({k: v for k, v in os.environ.items() if k in ENV_KEYS and v})
    return values
