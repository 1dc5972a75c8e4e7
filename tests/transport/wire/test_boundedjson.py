"""A peer's JSON is parsed within bounds (transport/wire/boundedjson.py): each hostile document is
refused by what was wrong before the parser works for it, and the next honest one still parses."""

from __future__ import annotations

import json

import pytest

from paretopipe.errors import WireError
from paretopipe.transport.wire.boundedjson import MAX_JSON_DEPTH, MAX_NUMBER_CHARS, loads_bounded


def _nested(depth: int) -> bytes:
    return ("[" * depth + "]" * depth).encode()


@pytest.mark.parametrize("raw, why", [
    (_nested(MAX_JSON_DEPTH + 1), f"JSON nested deeper than {MAX_JSON_DEPTH} levels"),
    (_nested(100_000), f"JSON nested deeper than {MAX_JSON_DEPTH} levels"),  # past the recursion limit
    (("1" * (MAX_NUMBER_CHARS + 1)).encode(), f"a JSON number of {MAX_NUMBER_CHARS + 1} characters"),
    (b'{"x": NaN}', "JSON constant NaN is not allowed"),
    (b'{"x": -Infinity}', "JSON constant -Infinity is not allowed"),
    (b'{"x": "\xff"}', "not UTF-8"),
    (b'{"x": ', "not valid JSON"),
])
def test_a_hostile_document_is_refused_by_what_is_wrong_and_the_next_honest_one_parses(raw, why):
    with pytest.raises(WireError, match=why):
        loads_bounded(raw)
    assert loads_bounded(b'{"seq": 3, "meta": {"cuts": ["k2"]}}') == {"seq": 3, "meta": {"cuts": ["k2"]}}


def test_the_limits_themselves_pass_and_brackets_inside_strings_do_not_count():
    assert loads_bounded(_nested(MAX_JSON_DEPTH)) == json.loads(_nested(MAX_JSON_DEPTH))
    deep_text = "[" * 50 + "{" * 50
    assert loads_bounded(json.dumps({"name": deep_text}).encode()) == {"name": deep_text}
    assert loads_bounded(("9" * MAX_NUMBER_CHARS).encode()) == int("9" * MAX_NUMBER_CHARS)
    assert loads_bounded(memoryview(b'[1.5, "\\"]"]')) == [1.5, '"]']
