"""Mutual authentication of the two ends of a data connection: HMAC-SHA256 over fresh nonces.

Stage 1 opens with a challenge nonce; stage 2 answers with its own nonce and an HMAC of both
nonces and its identity under the shared secret; stage 1 checks it and answers with an HMAC of the
nonces in the other order. The secret never crosses the wire, and a recorded exchange cannot be
replayed (the nonces are new each time). This authenticates the peer; the frames that follow
travel in the clear unless both stages ask for ``--encrypt``, which seals every one of them with
keys derived from the same secret and both nonces (:mod:`paretopipe.transport.aead`).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import secrets
from typing import Any

from ..errors import UsageError

SECRET_ENV = "PARETOPIPE_SECRET"
MIN_SECRET_CHARS = 16


def load_secret(value: str | None) -> bytes | None:
    """The shared secret from a ``.env`` value or the environment (``None``: no authentication)."""
    if value is None:
        value = os.environ.get(SECRET_ENV)
    if value is None or value == "":
        return None
    if len(value) < MIN_SECRET_CHARS:
        raise UsageError(f"{SECRET_ENV} has {len(value)} characters; use at least {MIN_SECRET_CHARS} "
                         f"(for example: python -c 'import secrets; print(secrets.token_hex(16))')")
    return value.encode()


def nonce() -> str:
    return secrets.token_hex(16)


def _canonical(fields: dict[str, Any]) -> bytes:
    return json.dumps(fields, sort_keys=True, separators=(",", ":")).encode()


def proof(secret: bytes, role: str, first: str, second: str, fields: dict[str, Any] | None = None) -> str:
    """HMAC of the role, two nonces (the speaker's peer's first) and the speaker's identity."""
    msg = b"|".join([role.encode(), first.encode(), second.encode(), _canonical(fields or {})])
    return hmac.new(secret, msg, hashlib.sha256).hexdigest()


def check(secret: bytes, claimed: Any, role: str, first: str, second: str, fields: dict[str, Any] | None = None) -> bool:
    """Constant-time comparison of a peer's proof with the expected one."""
    return isinstance(claimed, str) and hmac.compare_digest(claimed, proof(secret, role, first, second, fields))
