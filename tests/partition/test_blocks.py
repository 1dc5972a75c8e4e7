"""A model's blocks from its traced graph: the anchor's list where it has one, a detector's, and
any other model's children with a container expanded one level; a listed block that is not a cut
is an error, not a silently shorter model."""

from __future__ import annotations

import pytest
import torch
import torchvision
from torch import nn

from paretopipe.partition.blocks import find_blocks
from paretopipe.partition.fxcuts import Partitioner


def _blocks(model: nn.Module, name: str | None, size: int = 64):
    p = Partitioner(model.eval(), torch.zeros(1, 3, size, size), name)
    return p, find_blocks(name, p.traced, p.nodes, p.cuts, p._cut_at, p._by_name)


def test_the_anchors_list_gives_mobilenet_v2_its_eighteen_feature_blocks():
    p, blocks = _blocks(torchvision.models.mobilenet_v2(), "mobilenet_v2")
    assert [b.module for b in blocks] == [f"features.{i}" for i in range(18)]
    assert [b.k for b in blocks] == list(range(1, 19)) and blocks == p.blocks
    # each block ends where its module's last node is: the cut carries that module's output
    assert all(b.cut.width == 1 for b in blocks)


class _Net(nn.Module):
    """A stem, a body of four convolutions in one Sequential, a head."""

    def __init__(self) -> None:
        super().__init__()
        self.stem, self.head = nn.Conv2d(3, 4, 3), nn.Flatten()
        self.body = nn.Sequential(*[nn.Conv2d(4, 4, 3) for _ in range(4)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(self.stem(x)))


def test_a_model_the_anchor_never_split_gets_its_children_and_a_sequential_expanded():
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU(), nn.Sequential(nn.Conv2d(4, 4, 3), nn.ReLU()),
                          nn.Flatten(), nn.Linear(4 * 12 * 12, 2))
    # the last child ends at the output: no cut, so no block (k = K is the whole model on stage 1)
    assert [b.module for b in _blocks(model, None, 16)[1]] == ["0", "1", "2.0", "2.1", "3"]
    assert [b.module for b in _blocks(_Net(), None, 32)[1]] == ["stem", "body.0", "body.1", "body.2", "body.3"]


def test_a_listed_block_that_is_no_cut_is_refused():
    from paretopipe.partition import blocks as blocks_module

    p = Partitioner(torchvision.models.resnet18().eval(), torch.zeros(1, 3, 64, 64), "resnet18")
    listed = dict(blocks_module._ANCHOR_BLOCKS)
    try:
        blocks_module._ANCHOR_BLOCKS["resnet18"] = ["layer1.0", "no.such.module", "layer2.0"]
        blocks = find_blocks("resnet18", p.traced, p.nodes, p.cuts, p._cut_at, p._by_name)
        pytest.fail(f"a missing block was not refused: {blocks}")
    except RuntimeError as exc:
        assert "block no.such.module of resnet18 is not a valid cut" in str(exc)
    finally:
        blocks_module._ANCHOR_BLOCKS.clear()
        blocks_module._ANCHOR_BLOCKS.update(listed)
