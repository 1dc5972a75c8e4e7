"""llama.cpp as a peer engine, without its binaries: the split's mapping onto -ngl, a real GGUF's
header, where llama-server's log says it put the layers, and the lines that refuse what llama.cpp
cannot run. The runs themselves are tests/peers (make test-peers builds llama.cpp first)."""

from __future__ import annotations

import json
import platform

import pytest

from conftest import ROOT
from paretopipe import engines
from paretopipe.errors import UsageError
from paretopipe.llm import checkpoints, llamacpp
from paretopipe.controller.sweep.options import SweepOptions, check_options

REAL = "smollm2-135m-instruct"


def test_the_suites_split_k_offloads_the_layers_after_its_first_k_minus_one_and_the_head():
    # split k: the embedding and k-1 layers on stage 1. llama.cpp's -ngl counts the output layer (the
    # final norm and the head) as one: -ngl N offloads it and the last N-1 layers (llama-model.cpp's
    # i_gpu_start = n_layer + 1 - n_gpu_layers), so the server's L+1-k layers and the head are L+2-k
    assert llamacpp.offloaded_layers(1, 30) == 31
    assert llamacpp.offloaded_layers(16, 30) == 16
    assert llamacpp.offloaded_layers(31, 30) == 1  # the head alone: the logits still come back


def test_a_plan_spreads_its_servers_layers_by_tensor_split_in_rpc_order():
    two = llamacpp.offload([16], 30)
    assert (two.ngl, two.stage_layers) == (16, ((0, 15), (15, 30))) and two.argv() == ["-ngl", "16"]
    three = llamacpp.offload([10, 20], 30)
    assert three.stage_layers == ((0, 9), (9, 19), (19, 30))
    # llama.cpp gives device d the offloaded layers j (from 0) with j/ngl below its cumulative share:
    # 10 layers to the first server, the last 11 and the head to the second
    assert three.argv() == ["-ngl", "22", "--tensor-split", "10,12"]
    with pytest.raises(UsageError, match=r"plan 10,10 gives a server no layers"):
        llamacpp.offload([10, 10], 30)
    with pytest.raises(UsageError, match=r"split 32 is not one"):
        llamacpp.offload([10, 32], 30)


#: What llama-server 0.3.36 logged at -lv 4 for -ngl 22 --tensor-split 10,12 over two servers
#: (SmolLM2-135M, 30 layers; trimmed to the lines read, and one that must not be).
LOADED_LOG = """\
0.00.427.919 I load_tensors: offloading output layer to GPU
0.00.427.933 I load_tensors: offloading 21 repeating layers to GPU
0.00.677.397 I llama_kv_cache:        CPU KV buffer size =     3.38 MiB
0.00.699.157 I llama_kv_cache: RPC0[127.0.0.1:50071] KV buffer size =     3.75 MiB
0.00.711.156 I llama_kv_cache: RPC0[127.0.0.1:50072] KV buffer size =     4.12 MiB
0.00.712.317 I llama_kv_cache: size =   11.25 MiB (   512 cells,  30 layers,  1/1 seqs), K (f16):    5.62 MiB
0.00.717.265 I sched_reserve:        CPU compute buffer size =    14.01 MiB
"""


def test_where_llama_server_put_each_layer_is_read_from_its_kv_buffers():
    assert llamacpp.loaded_layers(LOADED_LOG) == {
        "layers": {"CPU": 9, "127.0.0.1:50071": 10, "127.0.0.1:50072": 11}, "output_offloaded": True}
    assert llamacpp.loaded_layers("0.00.1 I llama_server: model loaded\n") is None  # a log that does not say


@pytest.mark.parametrize("split", [0, 32])
def test_a_split_llamacpp_cannot_make_is_refused_with_the_valid_ones(split):
    with pytest.raises(UsageError, match=r"split %d is not one llama.cpp can make .*valid: 1\.\.31" % split):
        llamacpp.offloaded_layers(split, 30)


def test_the_real_models_gguf_header_gives_its_layers_vocabulary_and_quantisation():
    facts = llamacpp.gguf_facts(str(checkpoints.real_file(REAL)))
    assert (facts.architecture, facts.layers, facts.vocab, facts.quantisation) == ("llama", 30, 49152, "Q4_1")


def test_a_gguf_replaced_at_the_same_path_is_read_again_not_taken_from_the_facts_kept(tmp_path):
    path = tmp_path / "model.gguf"
    path.symlink_to(checkpoints.real_file(REAL))
    assert llamacpp.gguf_facts(str(path)).layers == 30
    assert llamacpp.gguf_facts(str(path)) is llamacpp.gguf_facts(str(path))  # kept, not parsed again
    path.unlink()
    path.write_bytes(b"not a gguf at all" * 10)
    with pytest.raises(UsageError, match=r"model.gguf is not a GGUF llama.cpp reads"):
        llamacpp.gguf_facts(str(path))


def test_a_file_that_is_not_a_gguf_is_refused_in_one_line(tmp_path):
    junk = tmp_path / "model.gguf"
    junk.write_bytes(b"not a gguf at all" * 10)
    with pytest.raises(UsageError, match=r"model.gguf is not a GGUF llama.cpp reads") as err:
        llamacpp.gguf_facts(str(junk))
    assert "\n" not in str(err.value)


def test_missing_binaries_are_refused_naming_the_build_script(tmp_path, monkeypatch):
    monkeypatch.setenv("PARETOPIPE_LLAMACPP_DIR", str(tmp_path / "empty"))
    with pytest.raises(UsageError, match=r"--engine llamacpp: llama.cpp 0.3.36 is not built on this machine .*"
                                         r"bash scripts/build_llamacpp.sh"):
        llamacpp.binaries()


def _fake_build(root, name: str, recipe: int, machine: str) -> None:
    folder = root / name / "bin"
    folder.mkdir(parents=True)
    for program in llamacpp.PROGRAMS:
        (folder / program).write_text("#!/bin/sh\n")
        (folder / program).chmod(0o755)
    (root / name / "build.json").write_text(json.dumps({"llama_cpp_python": llamacpp.PIN, "recipe": recipe,
                                                        "machine": machine, "flags": name}))


def test_only_a_build_of_this_recipe_for_this_machine_is_taken(tmp_path):
    """An older recipe's build (a native one that ran AMX kernels a VM refused) or another
    machine's is never run; the newest of this recipe is."""
    _fake_build(tmp_path, f"{llamacpp.PIN}-old", llamacpp.RECIPE - 1, platform.machine())
    _fake_build(tmp_path, f"{llamacpp.PIN}-arm", llamacpp.RECIPE, "not-" + platform.machine())
    with pytest.raises(UsageError, match="not built on this machine"):
        llamacpp.binaries(tmp_path)
    _fake_build(tmp_path, f"{llamacpp.PIN}-this", llamacpp.RECIPE, platform.machine())
    assert llamacpp.binaries(tmp_path).build["flags"] == f"{llamacpp.PIN}-this"


def test_the_pin_and_recipe_are_the_build_scripts():
    script = (ROOT / "scripts" / "build_llamacpp.sh").read_text()
    assert f"PIN={llamacpp.PIN}\n" in script and f"RECIPE={llamacpp.RECIPE}\n" in script


@pytest.mark.parametrize("options, why", [
    (dict(models=["mobilenetv2"]), "runs a language model given as a GGUF"),
    (dict(models=["tiny-lm"]), "runs a GGUF: give --model-dir FILE.gguf"),
    (dict(models=[REAL], backends=["rpc"]), "drop --backend rpc"),
    (dict(models=[REAL], splits="all"), r"its splits are 1\.\.31; give --splits 1-31"),
    (dict(models=[REAL], plans=[(10, 32)]), r"split 32 is not one llama.cpp can make"),
    (dict(models=[REAL], plans=[(20, 10)]), r"plan 20,10 gives a server no layers"),
    (dict(models=[REAL], splits="0,15"), r"split 0 is not one llama.cpp can make"),
    (dict(models=[REAL], stage_cpu_trace={"stage1": "trace.csv"}), "drop --stage-cpu-trace"),
])
def test_a_sweep_llamacpp_cannot_run_is_refused_before_anything_starts(options, why):
    with pytest.raises(UsageError, match=why):
        check_options(SweepOptions(engines=[engines.LLAMACPP], **{"splits": "15", **options}))


def test_llamacpp_runs_both_stages_so_it_is_never_one_stage_of_a_mix():
    with pytest.raises(UsageError, match="runs both stages as a system of its own"):
        engines.stage_engines_label("llamacpp,torch", 2)
    with pytest.raises(UsageError, match="give it alone"):
        engines.check_label("llamacpp+torch", 2)
