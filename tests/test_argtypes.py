"""The value types of command-line options: each parses its text or refuses it naming what is valid."""

from __future__ import annotations

import argparse

import pytest

from paretopipe import argtypes


@pytest.mark.parametrize("parse,text,value", [
    (argtypes.positive_int, "3", 3), (argtypes.nonneg_int, "0", 0), (argtypes.port_number, "65535", 65535),
    (argtypes.port_or_zero, "0", 0), (argtypes.positive_float, "0.5", 0.5), (argtypes.nonneg_float, "0", 0.0),
    (argtypes.percent, "5%", 0.05), (argtypes.percent, "12.5", 0.125)])
def test_valid_texts_parse(parse, text, value):
    assert parse(text) == pytest.approx(value)


@pytest.mark.parametrize("parse,text,message", [
    (argtypes.positive_int, "0", "'0' is out of range: a whole number of at least 1"),
    (argtypes.positive_int, "two", "'two' is not a whole number of at least 1"),
    (argtypes.port_number, "0", "a TCP port, 1..65535"), (argtypes.port_or_zero, "70000", "0..65535"),
    (argtypes.positive_float, "nan", "a positive number"), (argtypes.positive_float, "inf", "a positive number"),
    (argtypes.nonneg_float, "-1", "at least 0"), (argtypes.percent, "100%", "between 0 and 100")])
def test_invalid_texts_are_refused_naming_what_is_valid(parse, text, message):
    with pytest.raises(argparse.ArgumentTypeError, match=message):
        parse(text)


@pytest.mark.parametrize("text,want", [("127.0.0.1:1883", ("127.0.0.1", 1883)), ("[::1]:50052", ("::1", 50052)),
                                       (" 10.0.0.2:65535 ", ("10.0.0.2", 65535))])
def test_host_port_splits_at_the_last_colon_and_unbrackets_ipv6(text, want):
    assert argtypes.host_port(text, "--to", "127.0.0.1:50052") == want


@pytest.mark.parametrize("text", ["127.0.0.1", ":80", "127.0.0.1:0", "127.0.0.1:65536", "127.0.0.1:http"])
def test_host_port_refuses_in_one_line_naming_the_value_and_an_example(text):
    from paretopipe.errors import UsageError

    with pytest.raises(UsageError, match=r"^--to 'x': give HOST:PORT, e\.g\. 127\.0\.0\.1:50052$"):
        argtypes.host_port(text, "--to 'x'", "127.0.0.1:50052")
