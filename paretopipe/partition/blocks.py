"""A model's blocks: which module's last graph node ends block k, so that split index k (the
anchor's ``--split-index``) puts blocks 1..k on stage 1. The anchor's own lists for the models it
split, detectors' lists (a detector's block cut may carry several tensors), and for any other
model its top-level children, a Sequential or ModuleList expanded one level."""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping, Protocol, Sequence

from torch import fx, nn


class CutLike(Protocol):
    """What a block needs of its cut (:class:`~paretopipe.partition.fxcuts.CutPoint`)."""

    name: str
    position: int


# Anchor block lists: split_index k = "the first k blocks run on stage 1". Each entry names the
# module whose last graph node ends block k (k = 1..len). k = 0 and k = len + 1 are baselines.
_ANCHOR_BLOCKS: dict[str, list[str]] = {
    "mobilenet_v2": [f"features.{i}" for i in range(18)],
    "alexnet": [f"features.{i}" for i in range(12)],
    "vgg16": [f"features.{i}" for i in range(30)],
    "resnet18": [f"layer{s}.{b}" for s in range(1, 5) for b in range(2)],
    "resnet50": ["maxpool"] + [f"layer{s}.{b}" for s, n in ((1, 3), (2, 4), (3, 6), (4, 6))
                               for b in range(n)][:15],
    "inception_v3": ["Conv2d_1a_3x3", "Conv2d_2a_3x3", "Conv2d_2b_3x3", "maxpool1",
                     "Conv2d_3b_1x1", "Conv2d_4a_3x3", "maxpool2", "Mixed_5b", "Mixed_5c",
                     "Mixed_5d", "Mixed_6a", "Mixed_6b", "Mixed_6c", "Mixed_6d", "Mixed_6e",
                     "Mixed_7a", "Mixed_7b", "Mixed_7c", "avgpool"],
}


#: Detectors' blocks (paths in their traced body; ``X.*`` is each child of X). A detector's block cut
#: may carry several tensors: the features its pyramid takes from the backbone cross with it.
_DETECTOR_BLOCKS: dict[str, list[str]] = {
    "ssdlite320_mobilenet_v3_large": ["backbone.features.0.*", "backbone.features.1.*", "backbone.extra.*"],
    "fasterrcnn_mobilenet_v3_large_fpn": ["backbone.body.*"],
    "yolox_n": ["backbone.stem", "backbone.dark2", "backbone.dark3", "backbone.dark4", "backbone.dark5",
                "lateral_conv0", "C3_p4", "reduce_conv1", "C3_p3", "bu_conv2", "C3_n3", "bu_conv1", "C3_n4"],
}
_DETECTOR_BLOCKS["yolox_s"] = _DETECTOR_BLOCKS["yolox_n"]



def _module_path(node: fx.Node) -> list[str]:
    stack = node.meta.get("nn_module_stack") or {}
    paths = [v[0] if isinstance(v, tuple) else k for k, v in stack.items()]
    if node.op == "call_module":
        paths.append(str(node.target))
    return paths


@dataclasses.dataclass(frozen=True)
class Block:
    """Anchor-compatible block boundary: split_index ``k`` puts blocks 1..k on stage 1."""

    k: int
    module: str
    cut: Any  # a CutPoint


def find_blocks(model_name: str | None, traced: nn.Module, nodes: Sequence[fx.Node], cuts: Sequence[CutLike],
                cut_at: Mapping[int, CutLike], by_name: Mapping[str, CutLike]) -> list[Block]:
    """The blocks of a traced model: ``nodes`` in graph order, its single-tensor ``cuts``, the cut
    at each position that is one (``cut_at``) and every cut by name."""
    if model_name in _DETECTOR_BLOCKS:
        return _detector_blocks(_DETECTOR_BLOCKS[model_name], traced, nodes, cut_at)
    names = _ANCHOR_BLOCKS.get(model_name or "") or _generic_block_modules(traced)
    last_node_of = _last_node_of(nodes)
    by_position = {c.position: c for c in cuts}
    blocks: list[Block] = []
    for module in names:
        pos = last_node_of.get(module)
        # A cut's position may sit after trailing no-output nodes; map positions back to cuts.
        cut = (by_position.get(pos) or by_name.get(nodes[pos].name)) if pos is not None else None
        if cut is None:
            if model_name in _ANCHOR_BLOCKS:
                raise RuntimeError(f"block {module} of {model_name} is not a valid cut")
            continue
        if blocks and blocks[-1].cut.name == cut.name:
            continue
        blocks.append(Block(len(blocks) + 1, module, cut))
    return blocks


def _detector_blocks(paths: list[str], traced: nn.Module, nodes: Sequence[fx.Node],
                     cut_at: Mapping[int, CutLike]) -> list[Block]:
    modules: list[str] = []
    for path in paths:
        if path.endswith(".*"):
            parent = path[:-2]
            modules += [f"{parent}.{child}" for child, _ in traced.get_submodule(parent).named_children()]
        else:
            modules.append(path)
    last_node_of = _last_node_of(nodes)
    blocks: list[Block] = []
    for module in modules:
        cut = cut_at.get(last_node_of.get(module, -1))
        if cut is not None and not (blocks and blocks[-1].cut.name == cut.name):
            blocks.append(Block(len(blocks) + 1, module, cut))
    return blocks


def _last_node_of(nodes: Sequence[fx.Node]) -> dict[str, int]:
    """Each module path's last node in graph order: where the module's work ends."""
    last: dict[str, int] = {}
    for pos, node in enumerate(nodes):
        for path in _module_path(node):
            last[path] = pos
    return last


def _generic_block_modules(traced: nn.Module) -> list[str]:
    """Top-level children, with Sequential/ModuleList containers (one level deep) expanded."""
    names: list[str] = []
    for name, child in traced.named_children():
        if isinstance(child, (nn.Sequential, nn.ModuleList)):
            names += [f"{name}.{sub}" for sub, _ in child.named_children()]
            continue
        seqs = [(n, c) for n, c in child.named_children()
                if isinstance(c, (nn.Sequential, nn.ModuleList)) and len(c) >= 4]
        if len(seqs) == 1:
            for sub, grand in child.named_children():
                if sub == seqs[0][0]:
                    names += [f"{name}.{sub}.{g}" for g, _ in grand.named_children()]
                else:
                    names.append(f"{name}.{sub}")
        else:
            names.append(name)
    return names
