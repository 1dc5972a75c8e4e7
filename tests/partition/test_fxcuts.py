"""The partitioning engine: every cut of every named model reproduces the unsplit model."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from conftest import exhaustive_sample, traced
from paretopipe.partition import fxcuts, models
from paretopipe.errors import UsageError

NAMED = models.NAMED_MODELS
#: The models whose exactness tests take 10-40 s each here: in the slow tier (make test runs them).
HEAVY = {"vgg16", "vit_b_16", "inceptionv3", "resnet50"}
NAMED_PARAMS = [pytest.param(n, marks=pytest.mark.slow) if n in HEAVY else n for n in NAMED]
#: Every fine cut of a model is many stage builds: only the two smallest stay in the fast tier.
#: ResNet18, EfficientNet-B0 and ViT-B/16 are not here: tests/partition/test_live_sets.py checks
#: every cut of theirs with up to three live tensors, the one-tensor cuts among them.
FINE_PARAMS = [n if n in ("alexnet",) else pytest.param(n, marks=pytest.mark.slow) for n in NAMED
               if n not in ("resnet18", "efficientnet_b0", "vit_b_16")]
TOL = 1e-5
#: Every fine cut is one full forward; these two take any image size (adaptive pooling before the
#: classifier), and their graphs and cuts do not depend on it, so their cuts are checked on smaller
#: images (12x and 3.5x less compute): the fine cuts, the block baselines and the three-way splits.
FINE_SIZE = {"vgg16": 64, "inceptionv3": 160}
#: ViT only takes 224 px: its 31 fine cuts run on one image (half the compute). Batches of two cross
#: its cuts in its three-way partitions and block baselines, where the class token is expanded per image.
FINE_BATCH = {"vit_b_16": 1}
# Cut counts under the "exactly one live tensor" rule (torchvision builders, weights=None).
# Inception: 31 with torchvision's default transform_input=False; we build it with
# transform_input=True (what the anchor ran), which adds the cut after the transform's cat.
EXPECTED_CUTS = {"mobilenetv2": 72, "resnet18": 22, "resnet50": 38, "vgg16": 39, "alexnet": 21,
                 "inceptionv3": 32, "efficientnet_b0": 78, "vit_b_16": 31}
EXPECTED_K = {"mobilenetv2": 19, "alexnet": 13, "vgg16": 31, "resnet18": 9, "resnet50": 17,
              "inceptionv3": 20}


def _responsive(model, inputs, other) -> float:
    with torch.no_grad():
        return float((model(inputs) - model(other)).abs().max())


@pytest.mark.parametrize("name", FINE_PARAMS)
def test_every_fine_cut_is_exact(name):
    model, part, inputs, other = traced(name, batch=FINE_BATCH.get(name, 2), size=FINE_SIZE.get(name))
    assert len(part.cuts) == EXPECTED_CUTS[name]
    # The check only means something if outputs depend on the input far beyond the tolerance.
    assert _responsive(model, inputs, other) > 1000 * TOL
    with torch.no_grad():
        ref = model(inputs)
    # The heavy models' 32 to 39 cuts are as many forward passes: make test checks a seeded sample.
    for cut in exhaustive_sample(part.cuts, 8) if name in HEAVY else part.cuts:
        first, second = part.stages([cut.name])
        with torch.no_grad():
            mid = first(inputs)
            assert tuple(mid.shape) == cut.shape, cut.name
            assert mid.numel() * mid.element_size() == cut.nbytes
            out = second(mid)
        diff = float((out - ref).abs().max())
        assert diff <= TOL, f"{name} cut {cut.name}: max abs diff {diff}"


@pytest.mark.parametrize("name", NAMED)
def test_every_block_split_is_a_fine_cut_and_the_baselines_are_exact(name):
    """Block split k runs ``stages([block_cut(k)])``, the very call the fine-cut test checks for
    every cut, so the block splits are exact when their cuts are fine cuts in block order; only the
    k = 0 and k = K baselines (input and output) are left to check here."""
    model, part, inputs, _ = traced(name, size=FINE_SIZE.get(name))
    if name in EXPECTED_K:
        assert part.num_blocks == EXPECTED_K[name]
    assert part.block_cut(0) == fxcuts.INPUT and part.block_cut(part.num_blocks) == fxcuts.OUTPUT
    order = {cut.name: i for i, cut in enumerate(part.cuts)}
    inner = [part.block_cut(k) for k in range(1, part.num_blocks)]
    assert all(cut in order for cut in inner), name
    assert [order[cut] for cut in inner] == sorted({order[cut] for cut in inner}), name  # strictly in order
    with torch.no_grad():
        ref = model(inputs)
    for k in (0, part.num_blocks):
        stages = part.stages([part.block_cut(k)])
        assert len(stages) == 2
        assert fxcuts.verify(model, stages, inputs, reference=ref) <= TOL, f"{name} k={k}"


@pytest.mark.parametrize("name", NAMED_PARAMS)
def test_three_way_partitions_are_exact(name):
    model, part, inputs, _ = traced(name, size=FINE_SIZE.get(name))
    n = len(part.cuts)
    pairs = {(n // 4, n // 2), (n // 3, 2 * n // 3), (0, n - 1), (n // 2, n // 2 + 1)}
    with torch.no_grad():
        ref = model(inputs)
    for a, b in sorted(pairs):
        stages = part.stages([part.cuts[a].name, part.cuts[b].name])
        assert len(stages) == 3
        assert fxcuts.verify(model, stages, inputs, reference=ref) <= TOL, f"{name} cuts {a},{b}"


def test_stages_own_their_parameters():
    model, part, inputs, _ = traced("resnet18")
    first, second = part.stages([part.block_cut(4)])
    own1, own2 = set(first.state_dict()), set(second.state_dict())
    assert own1 and own2 and not own1 & own2
    assert set(model.state_dict()) == own1 | own2
    # A stage rebuilt elsewhere from its state dict alone computes the same thing.
    clone = part.stages([part.block_cut(4)])[1]
    for p in clone.parameters():
        p.data.zero_()
    clone.load_state_dict(second.state_dict())
    with torch.no_grad():
        assert torch.equal(clone(first(inputs)), second(first(inputs)))


def test_anchor_block_semantics_first_k_blocks_on_stage_one():
    model, part, inputs, _ = traced("mobilenetv2")
    first, _ = part.stages([part.block_cut(5)])
    with torch.no_grad():
        assert torch.equal(first(inputs), model.features[:5](inputs))
    _, part18, x18, _ = traced("resnet18")
    m18 = models.build("resnet18")
    stem = nn.Sequential(m18.conv1, m18.bn1, m18.relu, m18.maxpool, m18.layer1[0])
    with torch.no_grad():
        assert torch.equal(part18.stages([part18.block_cut(1)])[0](x18), stem(x18))


def test_cut_points_report_shapes_bytes_and_flops():
    _, part, _, _ = traced("mobilenetv2")
    flops = [c.flops_before for c in part.cuts]
    assert flops == sorted(flops) and 0 < flops[0] < part.total_flops
    for c in part.cuts:
        assert c.flops_before + c.flops_after == part.total_flops
        assert c.nbytes == 4 * torch.Size(c.shape).numel()


def test_inception_default_flag_gives_the_documented_31_cuts():
    import torchvision

    m = torchvision.models.inception_v3(weights=None, aux_logits=False, init_weights=True).eval()
    assert len(fxcuts.cut_points(m, torch.zeros(1, 3, 299, 299))) == 31


def test_generic_torchvision_model_splits_exactly():
    # A torchvision classifier the zoo does not name, through get_model. MNASNet 0.5 (19 blocks)
    # rather than ResNet-101 (39), whose weights took 10 s of CPU to build on every fresh machine
    # for this test alone; ResNet-18 and -50 are the zoo's residual nets.
    assert "mnasnet0_5" not in models.NAMED_MODELS
    model = models.build("mnasnet0_5", num_classes=10)
    x = torch.randn(2, 3, 64, 64, generator=torch.Generator().manual_seed(0))
    part = fxcuts.Partitioner(model, x, "mnasnet0_5")
    assert part.num_blocks == 19  # one live tensor at each: the stem's layers, the stacks' residual adds, the head
    for k in (1, part.num_blocks // 2, part.num_blocks - 1):
        assert fxcuts.verify(model, part.stages([part.block_cut(k)]), x) <= TOL


def test_split_out_of_range_states_valid_range():
    _, part, _, _ = traced("resnet18")
    with pytest.raises(UsageError, match=r"split index 12 out of range for resnet18: valid 0\.\.9"):
        part.block_cut(12)
    with pytest.raises(UsageError, match="unknown cut"):
        part.cut("no_such_node")


def test_untraceable_model_names_the_failing_op():
    class Branchy(nn.Module):
        def forward(self, x):
            if x.sum() > 0:  # data-dependent control flow
                return x
            return -x

    with pytest.raises(UsageError, match=r"cannot trace Branchy at .*test_fxcuts.py:\d+ .*make forward traceable"):
        fxcuts.cut_points(Branchy(), torch.zeros(1, 3))


