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
