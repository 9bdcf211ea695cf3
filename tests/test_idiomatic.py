"""Idiomatic artifacts: Caffe BatchNorm + Scale (and Torch7's BN) become one standard nn.BatchNorm2d
in model.py (folded into the convolution with ``fold``), folded into the convolution in ONNX (one
BatchNormalization where no convolution precedes); ONNX parameters in their
final shapes, inferred shapes and provenance metadata stored; the fp16 variant."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch

from convert.api import convert, load, reverify
from convert.fuse import sources
from convert.torch_emit import import_model
from convert.verify import run_onnx, run_torch

HEAD = 'input: "data" input_dim: 2 input_dim: 3 input_dim: 13 input_dim: 11\n'
CONV = ('layer { name: "conv" type: "Convolution" bottom: "data" top: "conv" '
        'convolution_param { num_output: 6 kernel_size: 3 bias_term: false } }\n')
BN = 'layer { name: "bn" type: "BatchNorm" bottom: "conv" top: "conv" batch_norm_param { eps: 0.001 } }\n'
SCALE = 'layer { name: "sc" type: "Scale" bottom: "conv" top: "conv" scale_param { bias_term: true } }\n'
TAIL = ('layer { name: "relu" type: "ReLU" bottom: "conv" top: "conv" }\n'
        'layer { name: "fc" type: "InnerProduct" bottom: "conv" top: "fc" inner_product_param { num_output: 5 } }\n')


def _net(tmp_path: Path, text: str, name: str = "net") -> Path:
    p = tmp_path / f"{name}.prototxt"
    p.write_text(text)
    return p


def _const_reshapes(m: onnx.ModelProto) -> int:
    """Reshape/Unsqueeze nodes whose data input is an initializer."""
    inits = {t.name for t in m.graph.initializer}
    return sum(n.op_type in ("Reshape", "Unsqueeze") and n.input[0] in inits for n in m.graph.node)


def test_bn_scale_is_one_standard_batchnorm(tmp_path: Path) -> None:
    res = convert(_net(tmp_path, HEAD + CONV + BN + SCALE + TAIL), out=tmp_path / "out")
    assert res.ok, res.report
    src = (res.dir / "model.py").read_text()
    assert "nn.BatchNorm2d(6, eps=0.001, momentum=0.001)  # bn + sc" in src  # Caffe's default moving average
    assert "nn.Linear(" in src and "nn.Conv2d(" in src
    assert "class " not in src.split("class Net")[0]  # no custom module classes
    m = onnx.load(str(res.dir / "model.onnx"))
    ops = [n.op_type for n in m.graph.node]
    assert ops == ["Conv", "Relu", "Flatten", "Gemm"] and _const_reshapes(m) == 0  # bn + sc folded
    net = import_model(res.dir / "model.py").load()
    assert set(net.state_dict()) >= {"bn.weight", "bn.bias", "bn.running_mean", "bn.running_var"}
    # the module is what torch.fx's conv + BN folding recognises: it folds, same numbers
    from torch.fx.experimental.optimization import fuse

    folded = fuse(net)
    assert not any(isinstance(mod, torch.nn.BatchNorm2d) for mod in folded.modules())
    x = torch.randn(2, 3, 13, 11)
    with torch.no_grad():
        assert torch.allclose(net(x), folded(x), atol=1e-5)


def test_onnx_keeps_shapes_and_metadata(tmp_path: Path) -> None:
    res = convert(_net(tmp_path, HEAD + CONV + BN + SCALE + TAIL), out=tmp_path / "out")
    m = onnx.load(str(res.dir / "model.onnx"))
    onnx.checker.check_model(m, full_check=True)
    inferred = {v.name for v in m.graph.value_info}
    assert {o for n in m.graph.node for o in n.output} - {o.name for o in m.graph.output} <= inferred
    meta = {p.key: p.value for p in m.metadata_props}
    assert meta["zoo.source"] == "net.prototxt" and meta["zoo.verification"] == "verified"
    errors = json.loads(meta["zoo.max_rel_error"])
    assert set(errors) >= {"onnxruntime", "pytorch"} and max(errors.values()) < 1e-4
    import hashlib

    assert meta["zoo.parameters_sha256"] == hashlib.sha256((res.dir / "model.safetensors").read_bytes()).hexdigest()
    nodes = [(n.op_type, list(n.input)) for n in m.graph.node]
    reverify(res.dir)  # metadata rewritten in place: one entry per key, the graph unchanged
    again = onnx.load(str(res.dir / "model.onnx"))
    keys = [p.key for p in again.metadata_props]
    assert len(keys) == len(set(keys)) == len(meta)
    assert [(n.op_type, list(n.input)) for n in again.graph.node] == nodes


def test_lone_batchnorm_and_lone_scale(tmp_path: Path) -> None:
    text = HEAD + CONV + BN + ('layer { name: "sc2" type: "Scale" bottom: "conv" top: "sc2" '
                               'scale_param { axis: 2 num_axes: 1 } }\n')
    res = convert(_net(tmp_path, text), out=tmp_path / "out")
    assert res.ok, res.report
    src = (res.dir / "model.py").read_text()
    assert "nn.BatchNorm2d(6, eps=0.001, momentum=0.001, affine=False)  # bn" in src
    assert "Affine(" in src  # not per-channel
    assert _const_reshapes(onnx.load(str(res.dir / "model.onnx"))) == 0


def test_bn_read_twice_is_not_fused(tmp_path: Path) -> None:
    text = HEAD + CONV + BN.replace('top: "conv"', 'top: "bn"') + SCALE.replace(
        'bottom: "conv" top: "conv"', 'bottom: "bn" top: "sc"') + \
        'layer { name: "sum" type: "Eltwise" bottom: "bn" bottom: "sc" top: "sum" }\n'
    g = load(_net(tmp_path, text)).graph
    assert [n.op.kind for n in g.nodes] == ["conv", "batchnorm", "affine", "eltwise"]
    assert not g.nodes[1].op.affine


def test_fold_into_convolution(tmp_path: Path) -> None:
    path = _net(tmp_path, HEAD + CONV + BN + SCALE + TAIL)
    plain = convert(path, out=tmp_path / "a")
    res = convert(path, out=tmp_path / "b", fold=True)
    assert res.ok, res.report
    src = (res.dir / "model.py").read_text()
    assert "BatchNorm" not in src and "nn.Conv2d(3, 6, 3)  # conv + bn + sc" in src
    ops = [n.op_type for n in onnx.load(str(res.dir / "model.onnx")).graph.node]
    assert "BatchNormalization" not in ops and ops.count("Conv") == 1
    x = {"data": np.random.default_rng(3).standard_normal((2, 3, 13, 11)).astype(np.float32)}
    a, b = run_onnx(plain.dir / "model.onnx", x)["fc"], run_onnx(res.dir / "model.onnx", x)["fc"]
    assert np.abs(a - b).max() <= 1e-5 * np.abs(a).max()
    g = load(path, fold=True).graph
    assert sources(g, g.nodes[0]) == ["conv", "bn", "sc"]  # the fused node names its layers


def test_torch7_batchnorm_maps_to_the_same_module(tmp_path: Path) -> None:
    lua = tmp_path / "bn.lua"
    lua.write_text("local m = nn.Sequential()\n"
                   "m:add(nn.SpatialConvolution(3, 4, 3, 3)):add(nn.SpatialBatchNormalization(4, 1e-3))\n"
                   "m:add(nn.ReLU()):add(nn.View(-1):setNumInputDims(3)):add(nn.Linear(4 * 5 * 5, 3))\n"
                   "m:add(nn.BatchNormalization(3, nil, 0.3))\n"
                   "return m\n")
    res = convert(lua, out=tmp_path / "out", shapes={"input": (2, 3, 7, 7)})
    assert res.ok, res.report
    src = (res.dir / "model.py").read_text()
    assert "nn.BatchNorm2d(4, eps=0.001)" in src and "nn.BatchNorm1d(3, momentum=0.3)" in src and "Affine(" not in src


@pytest.mark.parametrize(("fraction", "momentum"), [(None, 0.001), (0.9, 0.1), (0.99, 0.01)])
def test_caffe_batchnorm_momentum_is_one_minus_the_moving_average_fraction(
        tmp_path: Path, fraction: float | None, momentum: float) -> None:
    """Fine-tuning model.py moves the running statistics as Caffe would (inference unaffected)."""
    bn = BN if fraction is None else BN.replace("eps: 0.001", f"eps: 0.001 moving_average_fraction: {fraction}")
    res = convert(_net(tmp_path, HEAD + CONV + bn + SCALE + TAIL), out=tmp_path / "out")
    assert res.ok, res.report
    net = import_model(res.dir / "model.py").load()
    assert [m.momentum for m in net.modules() if isinstance(m, torch.nn.BatchNorm2d)] == [momentum]


def test_fp16_variant(tmp_path: Path) -> None:
    res = convert(_net(tmp_path, HEAD + CONV + BN + SCALE + TAIL), out=tmp_path / "out", fp16=True)
    m = onnx.load(str(res.dir / "model.fp16.onnx"))
    assert m.graph.input[0].type.tensor_type.elem_type == onnx.TensorProto.FLOAT
    assert not any(t.data_type == onnx.TensorProto.FLOAT for t in m.graph.initializer)
    fp16 = res.report["fp16"]  # this CPU computes fp16 (OpenVINO), or the report says it did not
    computed = "openvino" if fp16["compute"] == "fp16" else "onnxruntime"
    assert fp16["status"] == ("verified" if computed == "openvino" else "verified-fp32-compute")
    assert 0 < fp16["backends"][computed]["max_rel"] <= 2e-2
    meta = {p.key: p.value for p in m.metadata_props}
    assert meta["zoo.precision"] == "fp16" and meta["zoo.verification"] == fp16["status"]
    assert meta["zoo.verified_by"] == fp16["verified_by"] and "computed in fp" in meta["zoo.verified_by"]
    saved = json.loads((res.dir / "convert.json").read_text())["fp16"]
    assert saved["runtime"] == fp16["runtime"] and saved["compute"] == fp16["compute"]
    x = {"data": np.ones((3, 3, 13, 11), np.float32)}  # another batch size too
    assert run_onnx(res.dir / "model.fp16.onnx", x)["fc"].shape == run_torch(res.dir / "model.py", x)["fc"].shape


@pytest.mark.parametrize("name", ["resnet18"])
def test_zoo_resnet_has_no_custom_modules(name: str) -> None:
    g = load(Path("prototxt") / f"{name}.prototxt", seed=None).graph
    kinds = [n.op.kind for n in g.nodes]
    assert "affine" not in kinds and all(n.op.affine for n in g.nodes if n.op.kind == "batchnorm")
    assert len(load(Path("prototxt") / f"{name}.prototxt", seed=None, fold=True).graph.nodes) < len(g.nodes)


def test_forward_frees_intermediates(tmp_path: Path) -> None:
    """Every intermediate is deleted after its last use (eager PyTorch then reuses its memory, as
    torch.fx's code does); the outputs are kept, and verification still sees every value."""
    from convert.torch_emit import dying

    g = load(_net(tmp_path, HEAD + CONV + BN + SCALE + TAIL)).graph
    dead = [v for vs in dying(g).values() for v in vs]
    assert sorted(dead) == sorted(set(g.shapes) - set(g.outputs)) and len(dead) == len(set(dead))
    res = convert(_net(tmp_path, HEAD + CONV + BN + SCALE + TAIL), out=tmp_path / "out")
    assert "        del data\n" in (res.dir / "model.py").read_text()
    x = {"data": np.ones((2, 3, 13, 11), np.float32)}
    seen = run_torch(res.dir / "model.py", x, g, capture=True)
    assert set(seen) >= set(g.shapes)  # the intermediates are captured before they are deleted


def test_fp16_verification_computes_in_fp16(tmp_path: Path) -> None:
    """x * 1000 * 1000 * 1000 overflows fp16: ONNX Runtime's CPU provider computes the fp16 graph in
    float32 and does not see it; the fp16 check does (or says it computed in float32)."""
    from onnx import TensorProto as T
    from onnx import helper

    from convert.onnx_emit import run_openvino_fp16

    k = onnx.numpy_helper.from_array(np.array([1000.0], np.float16), "k")
    nodes = [helper.make_node("Cast", ["x"], ["h"], to=T.FLOAT16), helper.make_node("Mul", ["h", "k"], ["a"]),
             helper.make_node("Mul", ["a", "k"], ["b"]), helper.make_node("Mul", ["b", "k"], ["c"]),
             helper.make_node("Cast", ["c"], ["y"], to=T.FLOAT)]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", T.FLOAT, [1, 3])],
                          [helper.make_tensor_value_info("y", T.FLOAT, [1, 3])], [k])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), str(tmp_path / "m.onnx"))
    x = {"x": np.array([[1, 2, 0.5]], np.float32)}
    assert np.all(np.isfinite(run_onnx(tmp_path / "m.onnx", x)["y"]))  # the fp32 compute it replaces
    got = run_openvino_fp16(tmp_path / "m.onnx", x)
    if got is None:
        pytest.skip("this CPU has no fp16 arithmetic (OpenVINO's CPU plugin)")
    assert np.all(np.isinf(got["y"]))


def test_fp16_keeps_indices_past_2048_exact(tmp_path: Path) -> None:
    """ArgMax over 3000 classes: the index, cast to float, stays float32 in model.fp16.onnx (fp16
    rounds integers past 2048) and is compared exactly."""
    net = ('input: "data" input_dim: 2 input_dim: 3000 input_dim: 1 input_dim: 1\n'
           'layer { name: "am" type: "ArgMax" bottom: "data" top: "am" }\n')
    res = convert(_net(tmp_path, net), out=tmp_path / "out", fp16=True)
    assert res.ok, res.report
    fp16 = res.report["fp16"]
    assert fp16["exact_outputs"] == ["am"] and fp16["status"].startswith("verified"), fp16
    m = onnx.load(str(res.dir / "model.fp16.onnx"))
    assert [a.i for n in m.graph.node if n.op_type == "Cast" and n.input[0] != "data"
            for a in n.attribute] == [onnx.TensorProto.FLOAT] * 2  # the index cast and the output cast
    x = np.zeros((2, 3000, 1, 1), np.float32)
    x[0, 2999], x[1, 2051] = 1, 1
    assert run_onnx(res.dir / "model.fp16.onnx", {"data": x})["am"].reshape(-1).tolist() == [2999, 2051]


def test_fp16_refusal_is_reported_not_fatal(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    from convert import onnx_emit

    def refuse(src: Path, dst: Path) -> None:
        dst.write_bytes(b"partial")
        raise ValueError("no fp16 for this graph\nsecond line")

    monkeypatch.setattr(onnx_emit, "write_fp16", refuse)
    res = convert(_net(tmp_path, HEAD + CONV + BN + SCALE + TAIL), out=tmp_path / "out", fp16=True)
    assert res.ok and res.report["fp16"] == {"status": "refused", "reason": "ValueError: no fp16 for this graph"}
    assert not (res.dir / "model.fp16.onnx").exists()


def test_onnx_folds_only_what_follows_a_convolution(tmp_path: Path) -> None:
    """A batch norm after a pooling has no convolution to go into: one BatchNormalization."""
    pool = 'layer { name: "pool" type: "Pooling" bottom: "conv" top: "pool" pooling_param { pool: MAX kernel_size: 2 } }\n'
    bn2 = BN.replace('"bn"', '"bn2"').replace('"conv"', '"pool"')
    sc2 = SCALE.replace('"sc"', '"sc2"').replace('"conv"', '"pool"')
    res = convert(_net(tmp_path, HEAD + CONV + BN + SCALE + pool + bn2 + sc2), out=tmp_path / "out")
    assert res.ok, res.report
    ops = [n.op_type for n in onnx.load(str(res.dir / "model.onnx")).graph.node]
    assert ops == ["Conv", "MaxPool", "BatchNormalization"]
    assert (res.dir / "model.py").read_text().count("nn.BatchNorm2d(") == 2  # model.py keeps both


def test_a_wrong_fold_is_caught_by_verification(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The ONNX is folded from a copy; the reference runs the unfolded graph, so a folding bug is a
    mismatch that names the folded layer, not a wrong answer."""
    from convert import fuse as fuse_mod

    real = fuse_mod._bn_into_conv

    def off_by_one(g, a, b):  # type: ignore[no-untyped-def]
        node = real(g, a, b)
        if node is not None:
            g.weights[f"{node.attr}.bias"] = g.weights[f"{node.attr}.bias"] + 1
        return node

    monkeypatch.setattr(fuse_mod, "_bn_into_conv", off_by_one)
    res = convert(_net(tmp_path, HEAD + CONV + BN + SCALE + TAIL), out=tmp_path / "out")
    assert res.report["status"] == "mismatch"
    assert res.report["verification"]["backends"]["onnxruntime"]["ok"] is False
    assert res.report["verification"]["backends"]["pytorch"]["ok"] is True
    assert res.report["verification"]["first_divergence"]["layer"] == "sc"


def test_a_gain_float32_cannot_hold_is_not_folded(tmp_path: Path) -> None:
    from convert.fuse import folded

    g = load(_net(tmp_path, HEAD + CONV + BN + SCALE + TAIL)).graph
    assert [n.op.kind for n in folded(g).nodes][0] == "conv"
    bn = next(n for n in g.nodes if n.op.kind == "batchnorm")
    g.weights[bn.weight_names()["running_var"]][:] = -bn.op.eps  # gain 1 / 0
    assert [n.op.kind for n in folded(g).nodes][:2] == ["conv", "batchnorm"]
    assert [n.op.kind for n in g.nodes][:2] == ["conv", "batchnorm"]  # the graph itself untouched
