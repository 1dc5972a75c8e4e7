"""JSON from a peer, parsed within bounds: UTF-8, nested at most 16 deep, numbers of at most 40
characters, no NaN or Infinity; every limit is checked before the parser can be made to work for it."""

from __future__ import annotations

import json
import re
from typing import Any

from ...errors import WireError

MAX_JSON_DEPTH = 16
MAX_NUMBER_CHARS = 40
_JSON_STRING = re.compile(r'"(?:[^"\\]|\\.)*"')
_JSON_BRACKET = re.compile(r"[\[\]{}]")


def _number(text: str, kind: type) -> Any:
    if len(text) > MAX_NUMBER_CHARS:
        raise WireError(f"a JSON number of {len(text)} characters (at most {MAX_NUMBER_CHARS})")
    return kind(text)


def _no_constant(name: str) -> Any:
    raise WireError(f"JSON constant {name} is not allowed")


def loads_bounded(raw: bytes | bytearray | memoryview) -> Any:
    """JSON from a peer: UTF-8, nested at most 16 deep, numbers of at most 40 characters, no NaN.

    The limits are checked before (depth) and while (numbers) parsing, so a hostile document
    can neither exhaust the recursion limit nor make the parser build a 5000-digit integer."""
    try:
        text = bytes(raw).decode("utf-8")
    except UnicodeDecodeError as exc:
        raise WireError(f"not UTF-8: {exc}")
    depth = deepest = 0
    for m in _JSON_BRACKET.finditer(_JSON_STRING.sub('""', text)):
        depth += 1 if m.group() in "[{" else -1
        deepest = max(deepest, depth)
        if deepest > MAX_JSON_DEPTH:
            raise WireError(f"JSON nested deeper than {MAX_JSON_DEPTH} levels")
    try:
        return json.loads(text, parse_int=lambda t: _number(t, int), parse_float=lambda t: _number(t, float),
                          parse_constant=_no_constant)
    except WireError:
        raise
    except (ValueError, RecursionError) as exc:
        raise WireError(f"not valid JSON: {str(exc)[:120]}")
