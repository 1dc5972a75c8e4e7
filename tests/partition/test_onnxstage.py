"""A stage as an edge device runs it (paretopipe.partition.onnxstage): exported to ONNX once,
cached, checked against the torch stage, and run by ONNX Runtime or OpenVINO. Split at any block,
the engines' two stages give the unsplit torch model's logits within 1e-4 of their scale; a live
set of several tensors crosses; a stage that does not export names its operator in one line; and
a real two-stage run over TCP returns the unsplit model's outputs."""

from __future__ import annotations

import os

import pytest
import torch

from conftest import PYTHON, ROOT, exhaustive_sample, unexportable_model
from tcp_helpers import reference_outputs, run_in_threads
from tcp_helpers import run as tcp_run
from paretopipe.partition import onnxstage
from paretopipe.partition.activation import call_stage, live_tensors
from paretopipe.partition.stages import StageBuilder

TOLERANCE = 1e-4  # relative to the logits' scale (the issue's bound; float32 engines reach ~1e-6)


def _split_error(b: StageBuilder, k: int, engine: str, x: torch.Tensor) -> float:
    cuts = [b.partitioner.block_cut(k)]
    with torch.no_grad():
        y = call_stage(b.engine_stage(cuts, 1, engine, x.shape[0]), b.engine_stage(cuts, 0, engine, x.shape[0])(x))
        want = b.model(x)
    return onnxstage.max_rel_error(live_tensors(y), live_tensors(want))


@pytest.fixture(scope="module")
def mobilenet() -> StageBuilder:
    torch.set_num_threads(1)
    return StageBuilder("mobilenetv2")


def test_every_block_split_under_onnxruntime_gives_the_unsplit_logits(mobilenet):
    x = mobilenet.example_batch(2)
    ks = exhaustive_sample(range(1, mobilenet.partitioner.num_blocks), k=8)
    errors = {k: _split_error(mobilenet, k, "onnxruntime", x) for k in ks}
    assert max(errors.values()) < TOLERANCE, errors
    check = mobilenet.engine_checks[(tuple([mobilenet.partitioner.block_cut(ks[0])]), 0, "onnxruntime", 2)]
    assert check.engine == "onnxruntime" and check.version and check.threads == torch.get_num_threads()
    assert check.opset == onnxstage.OPSET and check.onnx_bytes > 0 and check.max_rel_error < TOLERANCE


def test_openvino_runs_the_same_exports_and_a_short_batch_runs_the_same_file(mobilenet):
    x = mobilenet.example_batch(2)
    assert _split_error(mobilenet, 7, "openvino", x) < TOLERANCE
    cuts = [mobilenet.partitioner.block_cut(7)]
    # The export the sweep made at its batch size serves a shorter batch (a fault's, a last one).
    short = mobilenet.example_batch(3)
    got = mobilenet.engine_stage(cuts, 0, "onnxruntime", 2)(short)
    with torch.no_grad():
        want = mobilenet.stage(cuts, 0)(short)
    assert got.shape == want.shape and onnxstage.max_rel_error([got], [want]) < TOLERANCE


def test_onnxruntimes_threads_wait_without_spinning_so_a_cpu_share_is_not_spent_on_waiting(mobilenet):
    """A pool that spins between operators spends a quota's budget waiting: a quarter core with two
    threads ran mobilenet_v2 in 2.5 s a batch (docs/engines.md). The session the stage opens says
    its threads do not spin, and still gives the torch stage's outputs."""
    cuts = [mobilenet.partitioner.block_cut(7)]
    stage = mobilenet.engine_stage(cuts, 0, "onnxruntime", 2).open()
    session = onnxstage.onnxruntime_session(stage.path, 2)
    assert session.get_session_options().get_session_config_entry("session.intra_op.allow_spinning") == "0"
    x = mobilenet.example_batch(2)
    with torch.no_grad():
        want = mobilenet.stage(cuts, 0)(x)
    assert onnxstage.max_rel_error([stage(x)], [want]) < TOLERANCE


def test_a_user_model_file_and_a_detectors_live_set_export():
    """A model file with a skip connection, and a detector whose cut carries three pyramid levels
    (both stages run under ONNX Runtime; stage 1 returns the live set as a tuple)."""
    skip = StageBuilder("examples/models/skipnet.py:build")
    x = skip.example_batch(2)
    for k in range(1, skip.partitioner.num_blocks):
        assert _split_error(skip, k, "onnxruntime", x) < TOLERANCE
    det = StageBuilder("ssdlite320_mobilenet_v3_large")
    cuts = [det.partitioner.block_cut(19)]
    live = det.engine_stage(cuts, 0, "onnxruntime", 1)(det.example_batch(1))
    assert isinstance(live, tuple) and len(live) == 3
    det.engine_stage(cuts, 1, "onnxruntime", 1)  # the heads, from the three levels, checked on them
    for index in (0, 1):
        assert det.engine_checks[(tuple(cuts), index, "onnxruntime", 1)].max_rel_error < TOLERANCE


def test_attention_stages_export_as_plain_operators_and_agree(tmp_path):
    """nn.MultiheadAttention in eval mode takes torch's fused fast path, which the exporter has no
    ONNX form of (every stage of a ViT was refused on aten::_native_multi_head_attention): the
    export traces it as plain operators, and the eager torch stage it is checked against keeps
    the fast path."""
    path = tmp_path / "tinyvit.py"
    path.write_text("from torchvision.models.vision_transformer import VisionTransformer\n"
                    "INPUT_SIZE = 32\n"
                    "def build(num_classes=10):\n"
                    "    return VisionTransformer(image_size=32, patch_size=8, num_layers=3, num_heads=2,\n"
                    "                             hidden_dim=16, mlp_dim=32, num_classes=num_classes)\n")
    vit = StageBuilder(f"{path}:build")
    x = vit.example_batch(2)
    assert torch.backends.mha.get_fastpath_enabled()
    for k in range(1, vit.partitioner.num_blocks):
        assert _split_error(vit, k, "onnxruntime", x) < TOLERANCE
    assert torch.backends.mha.get_fastpath_enabled()  # restored after each export


def test_a_stage_that_does_not_export_names_its_operator_and_prints_no_graph(tmp_path, capfd):
    model = unexportable_model(tmp_path)
    b = StageBuilder(model)
    cuts = [b.partitioner.block_cut(1)]
    b.engine_stage(cuts, 0, "onnxruntime", 1)  # the stem exports
    capfd.readouterr()
    with pytest.raises(onnxstage.EngineExportError) as caught:
        b.engine_stage(cuts, 1, "onnxruntime", 1)
    assert str(caught.value) == (f"stage 2 of {model} split at {cuts[0]} does not export to ONNX (opset 17): "
                                 f"operator aten::cumprod is not supported")
    out, err = capfd.readouterr()
    assert "graph" not in out + err and "%" not in out + err  # the exporter's C++ log stays out of the terminal


def test_an_export_is_cached_beside_the_weights_and_reused_by_the_next_process(tmp_path):
    """Two processes with the same cache folder: the first exports, the second loads the file."""
    code = ("import json, sys, torch\n"
            "from paretopipe.partition.stages import StageBuilder\n"
            "b = StageBuilder('examples/models/skipnet.py:build')\n"
            "cuts = [b.partitioner.block_cut(2)]\n"
            "b.engine_stage(cuts, 0, 'onnxruntime', 4)\n"
            "print(json.dumps(b.engine_checks[(tuple(cuts), 0, 'onnxruntime', 4)].manifest()))\n")
    import json

    script = tmp_path / "export_once.py"
    script.write_text(code)

    def export(**env: str) -> dict:
        """The manifest of one process's export: forked from the test process's zygote where its
        start-up variables allow (the cache folder is read at each call), else a fresh interpreter."""
        done = tcp_run([PYTHON, str(script)], cwd=ROOT, env={**os.environ, **env}, timeout=300)
        assert done.returncode == 0, done.stderr[-2000:]
        return json.loads(done.stdout.splitlines()[-1])

    runs = [export(PARETOPIPE_CACHE_DIR=str(tmp_path)) for _ in range(2)]
    assert [r["export"] for r in runs] == ["built", "cache"]
    assert runs[0]["max_rel_error"] == runs[1]["max_rel_error"] < TOLERANCE
    files = list((tmp_path / "engines").glob("*.onnx"))
    assert len(files) == 1 and files[0].stat().st_size == runs[0]["onnx_bytes"]
    # With the cache turned off, a process exports into a folder of its own and removes it at exit.
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    assert export(PARETOPIPE_CACHE_DIR="none", TMPDIR=str(scratch))["export"] == "uncached"
    assert not list(scratch.glob("paretopipe-engines-*"))  # torch leaves its own folders there


@pytest.mark.parametrize("engine, wire_dtype", [("onnxruntime", "float32"), ("onnxruntime+torch", "int8")])
def test_a_real_run_over_tcp_returns_the_unsplit_models_outputs(tmp_path, engine, wire_dtype):
    """Both stages over 127.0.0.1, stage 1 under ONNX Runtime (and stage 2 too, or torch): the
    outputs are the unsplit torch model's (float32), or stage 2's torch on exactly what int8 made
    of the engine's activation; each stage's manifest names its engine, version, threads and error."""
    from paretopipe.partition import wirequant
    from paretopipe.transport import inputs

    s1, _ = run_in_threads("mobilenetv2", 5, tmp_path, batch_size=2, num_batches=2, warmup=1, engine=engine,
                           wire_dtype=wire_dtype)
    if wire_dtype == "float32":
        want = reference_outputs("mobilenetv2", 2, 3)  # the warm-up batch's output is kept too
    else:
        b = StageBuilder("mobilenetv2")
        cuts = b.cuts_for(5)
        first = b.engine_stage(cuts, 0, "onnxruntime", 2)
        with torch.no_grad():
            want = [b.stage(cuts, 1)(wirequant.roundtrip(first(x), wire_dtype))
                    for x in inputs.batches("synthetic", 2, 224, 3, seed=0)]
    assert len(s1.outputs) == len(want)
    assert all(onnxstage.max_rel_error([g], [w]) < TOLERANCE for g, w in zip(s1.outputs, want))
    stages = s1.record["manifest"]["stages"]
    names = [s["engine"]["engine"] for s in stages]
    assert names == (["onnxruntime", "onnxruntime"] if engine == "onnxruntime" else ["onnxruntime", "torch"])
    assert stages[0]["engine"]["max_rel_error"] < TOLERANCE and stages[0]["engine"]["version"]
    assert s1.record["config"]["engine"] == engine
