"""The typed split: one value for a block split, an N-stage plan and adaptive, and every form it
is written in (runs.csv's label, the configuration key, the run configuration, table order)."""

from __future__ import annotations

import numpy as np
import pytest

from paretopipe.analysis.keys import config_key, split_label, split_sort_key
from paretopipe.errors import UsageError
from paretopipe.splitspec import ADAPTIVE, Split, parse_plans, parse_splits, sort_key


@pytest.mark.parametrize("written,label,key,config,stages", [
    (3, 3, "k03", 3, 2),
    ("12", 12, "k12", 12, 2),
    (np.int64(7), 7, "k07", 7, 2),
    ([3, 9], "3,9", "k3-9", [3, 9], 3),
    ((2, 5, 11), "2,5,11", "k2-5-11", [2, 5, 11], 4),
    ("3,9", "3,9", "k3-9", [3, 9], 3),
    # A one-cut plan (--split-blocks 9) keeps its plan form: a list in a record, "9" in runs.csv.
    ((9,), "9", "k9", [9], 2),
    ([9], "9", "k9", [9], 2),
    (ADAPTIVE, ADAPTIVE, "kadaptive", ADAPTIVE, 2),
    (" Adaptive ", ADAPTIVE, "kadaptive", ADAPTIVE, 2),
    # A fine cut that several tensors cross (sweep --max-live): named by its live set.
    ("maxpool+layer1_0_relu", "maxpool+layer1_0_relu", "cmaxpool.layer1_0_relu", "maxpool+layer1_0_relu", 2),
])
def test_every_written_form_gives_one_split_with_its_label_key_and_config(written, label, key, config, stages):
    split = Split.of(written)
    assert (split.label, split.key, split.config, split.stages) == (label, key, config, stages)
    assert Split.of(split) is split
    assert Split.of(split.config) == split  # a record's config reads back as the same split


@pytest.mark.parametrize("bad", ["x y", "+x", "a++b", "3,x", [5, 2], -1, True, 2.5, None, ""])
def test_what_is_no_split_is_refused_in_one_line_that_names_the_forms(bad):
    with pytest.raises(UsageError) as info:
        Split.of(bad)
    assert "\n" not in str(info.value)


def test_tables_list_block_splits_in_order_then_plans_then_adaptive_then_blanks():
    written = ["adaptive", 10, "3,9", 2, "9", float("nan"), [1, 4, 8], np.int64(0), "b+c", "a+b"]
    assert sorted(written, key=sort_key)[:7] == [np.int64(0), 2, "9", 10, "a+b", "b+c", "3,9"]
    assert sorted(written, key=sort_key)[7:9] == [[1, 4, 8], "adaptive"]
    assert split_sort_key is sort_key


def test_the_session_labels_and_keys_come_from_the_split():
    assert split_label([3, 9]) == "3,9" and split_label(4) == 4 and split_label(None) is None
    assert config_key("mobilenet_v2", "tcp", "lan", 4) == "mobilenet_v2_tcp_lan_k04"
    assert config_key("resnet18", "rpc", "wifi", Split((3, 9))) == "resnet18_rpc_wifi_k3-9"
    assert config_key("resnet18", "tcp", "lte", ADAPTIVE, "aesgcm") == "resnet18_tcp_lte_kadaptive_aesgcm"


def test_parse_splits():
    assert parse_splits("all", 4) == [0, 1, 2, 3, 4]
    assert parse_splits("1,3-4,3", 4) == [1, 3, 4]
    with pytest.raises(UsageError, match=r"split index 9 out of range: valid 0\.\.4"):
        parse_splits("9", 4)
    with pytest.raises(UsageError, match="bad --splits"):
        parse_splits("x-y", 4)


def test_parse_plans_and_the_members_of_splits_text():
    from paretopipe.splitspec import split_adaptive, split_cuts

    assert parse_plans("3,9; 5,12;") == [(3, 9), (5, 12)]
    for text, match in (("9,3", "must be increasing"), ("3,9;5", "same number of stages"), (";", "names no plan"),
                        ("3,x", "bad --split-blocks")):
        with pytest.raises(UsageError, match=match):
            parse_plans(text)
    assert split_adaptive("1, adaptive,4") == ("1,4", ["adaptive"]) and split_adaptive("1,4") == ("1,4", [])
    assert split_adaptive("sciot,1,Adaptive") == ("1", ["sciot", "adaptive"])
    assert split_cuts("2,maxpool+layer1_0_relu,5") == ("2,5", ["maxpool+layer1_0_relu"])
    assert split_cuts("all") == ("all", [])
