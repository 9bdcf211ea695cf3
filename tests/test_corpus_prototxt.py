"""Every shipped prototxt in the corpus (realworld + seeds) loads into a sound graph or fails with
the one-line unsupported-layer message. Full conversion and verification of all of them is the
check command ``python -m zoo.checks corpus`` (minutes); a few small ones are verified here."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import CORPUS, corpus_files

from convert.api import convert, load
from convert.errors import Unsupported
from convert.ir import check

FILES = corpus_files("realworld", "*.prototxt") + corpus_files("seeds", "*.prototxt")


@pytest.mark.skipif(not FILES, reason="corpus not available")
@pytest.mark.parametrize("path", FILES, ids=[str(p.relative_to(CORPUS)) for p in FILES])
def test_loads_or_names_unsupported_layers(path: Path) -> None:
    try:
        g = load(path, seed=None).graph
    except Unsupported as e:
        assert str(e).startswith(f"{path}: unsupported caffe layer type")
        return
    assert check(g) == [] and g.outputs


SMALL = ["realworld/BVLC/caffe/examples/mnist/lenet.prototxt",
         "realworld/BVLC/caffe/examples/cifar10/cifar10_full.prototxt",
         "realworld/forresti/SqueezeNet/SqueezeNet_v1.1/deploy.prototxt",
         "realworld/shicai/MobileNet-Caffe/mobilenet_v2_deploy.prototxt",
         "realworld/opencv_extra-dnn/gtsrb.prototxt"]


@pytest.mark.parametrize("rel", SMALL)
def test_small_real_nets_verify(rel: str, tmp_path: Path) -> None:
    path = CORPUS / rel
    if not path.exists():
        pytest.skip("corpus not available")
    g = load(path, seed=None).graph
    shapes = {k: (1, *v[1:]) for k, v in g.inputs.items()}  # batch 1 keeps it quick
    res = convert(path, out=tmp_path, shapes=shapes)
    assert res.report["status"] == "verified", res.report["verification"]
