"""A later stage's items, fed real frames over a real socket pair: an image batch's activation is
checked against its cut before use and computes the unsplit model's part; an int8 wire is
dequantised on arrival; a generation's step computes what the unsplit stage does and names its
place as it goes on; a frame of the wrong shape is refused naming the cut and what crosses it."""

from __future__ import annotations

import socket

import pytest
import torch

from paretopipe.errors import WireError
from paretopipe.llm.builder import LMBuilder
from paretopipe.partition import wirequant
from paretopipe.partition.stages import StageBuilder
from paretopipe.transport import wire
from paretopipe.transport.runconfig import Generation, RunConfig
from paretopipe.transport.tcp.stageitems import GenerationItems, ImageItems, stage_items

K = 6


@pytest.fixture(scope="module")
def builder():
    return StageBuilder("mobilenetv2")


def _crossed(tensor, meta=None) -> wire.Frame:
    """``tensor`` as the stage reads it: sent and read back over a socket pair."""
    a, b = socket.socketpair()
    with a, b:
        wire.send_frame(a, wire.TENSOR, 3, tensor, meta)
        return wire.recv_frame(b)


def _image_cfg(builder, dtype: str = "float32") -> RunConfig:
    return RunConfig(model=builder.name, cuts=[builder.partitioner.block_cut(K)], split_index=K, wire_dtype=dtype)


def test_an_image_batch_is_checked_against_its_cut_and_computes_the_unsplit_models_part(builder):
    cfg = _image_cfg(builder)
    items = stage_items(builder, cfg, 1)
    assert isinstance(items, ImageItems) and items.codec_dtype == "float32" and items.engine()["engine"] == "torch"
    x = torch.randn(1, 3, builder.input_size, builder.input_size, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        head = builder.stage(cfg.cuts, 0)(x)
        f = _crossed(head)
        decoded, extra_s = items.decode(f)
        assert decoded is None and extra_s == 0.0  # float32: the frame's own tensor is the input
        out, compute_s = items.forward(f, decoded, items.stage)
        want = builder.model.eval()(x)
    assert compute_s > 0 and torch.allclose(out, want, atol=1e-5)
    payload, meta = items.result(f, out)
    assert meta == {} and items.relayed({"token": 5}) == {} and items.part(None) == {}
    with pytest.raises(WireError, match=rf"batch 3 carries 1 tensor: Bx7x7x7 float32; what crosses {cfg.cuts[0]} is"):
        items.decode(_crossed(torch.zeros(1, 7, 7, 7)))


def test_an_int8_batch_is_dequantised_on_arrival_and_goes_on_quantised(builder):
    cfg = _image_cfg(builder, "int8")
    items = ImageItems(builder, cfg, 1)
    x = torch.randn(1, 3, builder.input_size, builder.input_size, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        head = builder.stage(cfg.cuts, 0)(x)
    f = _crossed(wirequant.encode_activation(head, "int8"))
    decoded, dequantise_s = items.decode(f)
    assert dequantise_s > 0 and decoded.shape == head.shape
    assert torch.allclose(decoded, head, atol=float(head.abs().max()) / 100)  # int8: within a step per row
    parts, meta = items.onward(f, decoded)
    assert meta is None and [p.dtype for p in parts] == list(wirequant.PART_DTYPES["int8"])


def test_a_generations_step_computes_what_the_unsplit_stage_does_and_names_its_place_onward():
    lm = LMBuilder("tiny-lm")
    cfg = RunConfig(model="tiny-lm", cuts=["lm2", "lm4"], split_index=[2, 4],
                    generation=Generation(gen_tokens=3, streams=1, prompt_len=5, warmup_streams=0))
    items = stage_items(lm, cfg, 1)
    assert isinstance(items, GenerationItems) and items.codec_dtype == "float32" and items.engine() is None
    first = lm.stage(cfg.cuts, 0)
    first.reset()
    ids = torch.arange(1, 6).unsqueeze(0)
    with torch.no_grad():
        hidden = first.forward(0, ids, 0)
    place = {"stream": 0, "start": 0, "step": 0}
    f = _crossed(hidden, place)
    x, extra_s = items.decode(f)
    assert extra_s == 0.0 and torch.equal(x, hidden)
    out, _ = items.forward(f, x, None)
    reference = lm.stage(cfg.cuts, 1)
    reference.reset()
    with torch.no_grad():
        assert torch.equal(out, reference.forward(0, hidden, 0))
    tensors, meta = items.onward(f, out)
    assert meta == place and torch.equal(tensors, out)
    with pytest.raises(WireError, match="a TENSOR must name a stream"):
        items.decode(_crossed(hidden, {"stream": 7, "start": 0, "step": 0}))
    with pytest.raises(WireError, match="does not move"):
        items.switched("lm3")
