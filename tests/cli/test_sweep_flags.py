"""The sweep's option table: each option declared once, and the parser, the options and the
resolved experiment table generated from it agree with each other."""

from __future__ import annotations

import dataclasses

import pytest

from paretopipe.cli import experiment, sweep, sweep_flags, sweep_options
from paretopipe.controller.sweep import SweepOptions

FIELDS = {f.name: f for f in dataclasses.fields(SweepOptions)}


def test_every_flag_that_sets_a_field_names_a_real_field_with_the_same_default():
    args = sweep.parser().parse_args([])
    for flag in sweep_flags.FLAGS:
        if not flag.option:
            continue
        assert flag.option in FIELDS, f"{flag.flags[0]} sets SweepOptions.{flag.option}, which does not exist"
        field = FIELDS[flag.option]
        default = field.default_factory() if field.default_factory is not dataclasses.MISSING else field.default
        assert getattr(args, flag.name) == default, f"{flag.flags[0]}: parser and SweepOptions defaults differ"


def test_a_flag_stored_as_it_is_sets_a_field_and_a_derived_one_says_how_it_is_stored():
    for flag in sweep_flags.FLAGS:
        if flag.stored is True:
            assert flag.option, f"{flag.flags[0]} is derived but stored as a field it does not set"


def test_each_flag_is_declared_once_and_the_parser_holds_every_one():
    names = [f.name for f in sweep_flags.FLAGS]
    assert len(names) == len(set(names))
    spellings = [s for f in sweep_flags.FLAGS for s in f.flags]
    assert len(spellings) == len(set(spellings))
    dests = {a.dest for a in sweep.parser()._actions}
    assert set(names) <= dests
    # The shared helpers' flags are in the parser too, in their groups.
    assert {"dataset", "data_dir", "enable_prefetch", "prefetch_batches", "objectives"} <= dests


def test_every_key_of_the_resolved_table_is_an_option_an_experiment_file_accepts(tmp_path):
    opts = sweep_options.options_from_args(sweep.parser().parse_args(["--local", "--precision", "5%", "--deadline-ms", "100",
                                                               "--stage-threads", "1,2", "--backend", "both"]))
    table = sweep_flags.resolved_table(opts)
    assert table["precision"] == "5%" and table["deadline_ms"] == 100.0 and table["backend"] == "tcp,rpc"
    assert table["stage_threads"] == "1,2" and table["local"] is True
    path = tmp_path / experiment.FILE_NAME
    experiment.write(path, table, {}, None)
    exp = experiment.read(path, sweep.parser())
    assert set(exp.defaults) == {experiment.ALIASES.get(k, k) for k, v in table.items() if v is not None}
    # Read back as the flags' defaults, the file resolves to the same table.
    p = sweep.parser()
    p.set_defaults(**exp.defaults)
    again = sweep_flags.resolved_table(sweep_options.options_from_args(p.parse_args([])))
    assert again == table


@pytest.mark.parametrize("argv, stored", [(["--engine", "torch,openvino"], {"engine": ["torch", "openvino"]}),
                                           (["--stage-engines", "onnxruntime,torch"],
                                            {"engine": None, "stage_engines": "onnxruntime,torch"})])
def test_engines_are_stored_and_read_back_as_given(tmp_path, argv, stored):
    """--engine's list and --stage-engines' one per stage both survive experiment.toml (--rerun)."""
    opts = sweep_options.options_from_args(sweep.parser().parse_args(["--local", *argv]))
    table = sweep_flags.resolved_table(opts)
    assert {k: table[k] for k in stored} == stored
    path = tmp_path / experiment.FILE_NAME
    experiment.write(path, table, {}, None)
    p = sweep.parser()
    p.set_defaults(**experiment.read(path, sweep.parser()).defaults)
    assert sweep_options.options_from_args(p.parse_args([])).engines == opts.engines


@pytest.mark.parametrize("name", sorted(experiment.INVOCATION - sweep_flags.COMMON_INVOCATION))
def test_an_invocation_flag_is_never_taken_from_an_experiment_file(tmp_path, name):
    path = tmp_path / "exp.toml"
    path.write_text(f"[sweep]\n{name} = true\n")
    with pytest.raises(Exception, match="unknown option"):
        experiment.read(path, sweep.parser())
