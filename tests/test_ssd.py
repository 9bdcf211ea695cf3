"""SSD detection head: PriorBox and DetectionOutput against hand-computed values, between the
float64 reference, PyTorch and ONNX Runtime, and against OpenCV 4.x through the whole conversion
(tiny nets with real detections, a res10-face-detector-like net, the corpus SSD files)."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from convert.api import convert
from convert.detections import metrics as det_metrics
from convert.errors import BadModel, ShapeError, Unsupported
from convert.ir import Graph
from convert.ops.detect import DetectionOutput, PriorBox
from convert.torch_emit import model_source

CORPUS = Path(__file__).resolve().parents[2] / "shared" / "corpus"
SSD_FILES = [CORPUS / "realworld/opencv_extra-dnn/ssd_vgg16.prototxt",
             CORPUS / "realworld/Shinung/gpu-rest-engine@28a0991/models/VGGNet/VOC0712/SSD_300x300/deploy.prototxt"]


def _input(name: str, shape: tuple[int, ...]) -> str:
    dims = " ".join(f"dim: {d}" for d in shape)
    return f'layer {{ name: "{name}" type: "Input" top: "{name}" input_param {{ shape {{ {dims} }} }} }}\n'


def _layer(name: str, typ: str, bottoms: list[str], params: str = "") -> str:
    bl = "".join(f' bottom: "{b}"' for b in bottoms)
    return f'layer {{ name: "{name}" type: "{typ}"{bl} top: "{name}" {params} }}\n'


def _conv(name: str, bottom: str, n: int, k: int = 3, stride: int = 1, pad: int = 1) -> str:
    return _layer(name, "Convolution", [bottom],
                  f"convolution_param {{ num_output: {n} kernel_size: {k} stride: {stride} pad: {pad} }}")


def _head(feat: str, priors: str, classes: int, locs: int) -> tuple[str, list[str]]:
    """loc and conf convolutions of one feature map, permuted and flattened, and its PriorBox."""
    text = _conv(f"{feat}_loc", feat, priors_per_cell(priors) * 4 * locs)
    text += _conv(f"{feat}_conf", feat, priors_per_cell(priors) * classes)
    for kind in ("loc", "conf"):
        text += _layer(f"{feat}_{kind}_perm", "Permute", [f"{feat}_{kind}"],
                       "permute_param { order: 0 order: 2 order: 3 order: 1 }")
        text += _layer(f"{feat}_{kind}_flat", "Flatten", [f"{feat}_{kind}_perm"], "flatten_param { axis: 1 }")
    text += _layer(f"{feat}_pb", "PriorBox", [feat, "data"], f"prior_box_param {{ {priors} }}")
    return text, [f"{feat}_loc_flat", f"{feat}_conf_flat", f"{feat}_pb"]


def priors_per_cell(params: str) -> int:
    """Priors per cell of a prior_box_param text (min/max sizes, aspect ratios, flip)."""
    mins, maxs = params.count("min_size"), params.count("max_size")
    ars = {1.0}
    flip = "flip: false" not in params
    for t in params.split("aspect_ratio:")[1:]:
        ar = float(t.split()[0])
        if all(abs(ar - a) >= 1e-6 for a in ars):
            ars |= {ar, 1 / ar} if flip else {ar}
    return mins * len(ars) + maxs


PRIORS = ["min_size: 9 max_size: 20 aspect_ratio: 2 clip: false variance: 0.1 variance: 0.1 variance: 0.2 "
          "variance: 0.2",
          "min_size: 17 max_size: 30 aspect_ratio: 2 aspect_ratio: 3 clip: false variance: 0.1 variance: 0.1 "
          "variance: 0.2 variance: 0.2"]


def ssd_net(det: str, classes: int = 3, share: bool = True, shape: tuple[int, ...] = (1, 3, 37, 45),
            priors: list[str] | None = None, damp: float = 1.0) -> str:
    """A two-head SSD: conv (stride 4) -> head 1, conv (stride 2) -> head 2; concat, softmax, detect.
    ``damp`` scales the class logits (saturated float32 scores of 1.0 tie where float64 does not)."""
    priors = priors or PRIORS
    locs = 1 if share else classes
    text = 'name: "ssd"\n' + _input("data", shape) + _conv("f1", "data", 8, 3, 4, 0)
    text += _conv("f2", "f1", 8, 3, 2, 1)
    parts: list[list[str]] = []
    for feat, pri in zip(("f1", "f2"), priors):
        t, tops = _head(feat, pri, classes, locs)
        text += t
        parts.append(tops)
    for i, name in enumerate(("loc", "conf_cat", "priors")):
        axis = 2 if name == "priors" else 1
        text += _layer(name, "Concat", [p[i] for p in parts], f"concat_param {{ axis: {axis} }}")
    text += _layer("conf_r", "Reshape", ["conf_cat"], f"reshape_param {{ shape {{ dim: 0 dim: -1 dim: {classes} }} }}")
    if damp != 1.0:
        text += _layer("conf_d", "Power", ["conf_r"], f"power_param {{ scale: {damp} }}")
    text += _layer("conf_s", "Softmax", ["conf_d" if damp != 1.0 else "conf_r"], "softmax_param { axis: 2 }")
    text += _layer("conf", "Flatten", ["conf_s"])
    share_text = "true" if share else "false"
    if "background_label_id" not in det:  # OpenCV needs it given
        det += " background_label_id: 0"
    return text + _layer("det", "DetectionOutput", ["loc", "conf", "priors"],
                         f"detection_output_param {{ num_classes: {classes} share_location: {share_text} {det} }}")


def _verified(text: str, tmp_path: Path, name: str = "net", opencv: str = "agrees") -> dict:
    src = tmp_path / f"{name}.prototxt"
    src.write_text(text)
    res = convert(src, out=tmp_path / "out")
    v = res.report["verification"]["backends"]
    assert res.report["status"] == "verified", v
    assert v["pytorch"]["ok"] and v["onnxruntime"]["ok"], v
    cv = v.get("opencv", {})
    if opencv == "agrees":
        assert cv.get("ok") is True, cv
    return v


# --- PriorBox ---------------------------------------------------------------------------------

def test_prior_box_hand_computed() -> None:
    op = PriorBox(((4.0, 4.0), (6.0, 3.0)), (0.1, 0.1, 0.2, 0.3), offset=0.25)
    feat, img = np.zeros((2, 5, 3, 7)), np.zeros((2, 3, 31, 47))
    y = op.reference([feat, img], {})[0]
    assert y.shape == (1, 2, 3 * 7 * 2 * 4)
    boxes = y[0, 0].reshape(3, 7, 2, 4)
    cx, cy = (5 + 0.25) * 47 / 7, (2 + 0.25) * 31 / 3  # cell (h=2, w=5)
    want = [(cx - 3) / 47, (cy - 1.5) / 31, (cx + 3) / 47, (cy + 1.5) / 31]
    np.testing.assert_allclose(boxes[2, 5, 1], want, rtol=0, atol=1e-12)
    np.testing.assert_allclose(y[0, 1].reshape(-1, 4), np.tile([0.1, 0.1, 0.2, 0.3], (3 * 7 * 2, 1)))
    clipped = PriorBox(((40.0, 40.0),), clip=True, img=(20, 10), step=(3.0, 2.5)).reference([feat, img], {})[0]
    b = clipped[0, 0].reshape(3, 7, 1, 4)
    assert b.min() == 0 and b.max() == 1
    np.testing.assert_allclose(b[1, 0, 0], [0, 0, min(1, (0.5 * 2.5 + 20) / 10), 1])


AGREE, KNOWN, REFUSED = "agrees", "deviates (known)", "refused"
PRIOR_CASES = [  # (prior_box_param, what OpenCV does)
    ("min_size: 7 max_size: 15 min_size: 11 max_size: 20 aspect_ratio: 2 aspect_ratio: 3 flip: true clip: true "
     "variance: 0.1 variance: 0.1 variance: 0.2 variance: 0.2 offset: 0.3 step_h: 5 step_w: 4.5", AGREE),
    ("min_size: 4 max_size: 9 aspect_ratio: 2 aspect_ratio: 0.5 flip: false variance: 0.1 variance: 0.2 "
     "variance: 0.3 variance: 0.4 step: 3.5 offset: 0.1 clip: false", AGREE),
    ("min_size: 5 aspect_ratio: 0.5 aspect_ratio: 2 flip: false clip: false variance: 0.2 img_size: 50 step: 6", KNOWN),
    ("min_size: 8 max_size: 13 aspect_ratio: 3 clip: true img_h: 41 img_w: 33 variance: 0.1", KNOWN),
    ("min_size: 30 variance: 0.1", KNOWN),  # OpenCV clips by default
    ("min_size: 6 clip: false", REFUSED),  # OpenCV needs variance (Caffe's default: 0.1)
]


@pytest.mark.parametrize("params,opencv", PRIOR_CASES, ids=range(len(PRIOR_CASES)))
def test_prior_box_agrees_with_opencv(params: str, opencv: str, tmp_path: Path) -> None:
    text = ('name: "pb"\n' + _input("data", (1, 3, 37, 45)) + _conv("f", "data", 4, 3, 4, 0)
            + _layer("pb", "PriorBox", ["f", "data"], f"prior_box_param {{ {params} }}"))
    v = _verified(text, tmp_path, opencv="any")["opencv"]
    assert (v.get("status") or (AGREE if v.get("ok") else "")) == opencv, v
    assert opencv != AGREE or v["max_rel"] < 1e-6


def test_caffe_golden_prior_box_prototxt(tmp_path: Path) -> None:
    """The corpus' prior_box.prototxt (two min/max sizes, flip, a 3x4 map on a 10x10 image)."""
    path = CORPUS / "caffe-golden/prior_box.prototxt"
    if not path.is_file():
        pytest.skip("corpus absent")
    v = _verified(path.read_text(), tmp_path, "prior_box", opencv="any")["opencv"]
    assert v.get("ok") is True or v.get("status") == "refused", v


def test_prior_box_follows_the_input_size(tmp_path: Path) -> None:
    """Converted at 37x45, run at 51x30: model.py and model.onnx give the priors of the new size."""
    import onnxruntime as ort
    import torch

    from convert.torch_emit import import_model

    src = tmp_path / "pb.prototxt"
    src.write_text('name: "pb"\n' + _input("data", (1, 3, 37, 45)) + _conv("f", "data", 4, 3, 4, 0)
                   + _layer("pb", "PriorBox", ["f", "data"], f"prior_box_param {{ {PRIOR_CASES[0][0]} }}"))
    res = convert(src, out=tmp_path / "out")
    x = np.random.default_rng(1).standard_normal((2, 3, 51, 30)).astype(np.float32)
    op = next(n.op for n in _load_ir(res.dir).nodes if n.op.kind == "prior_box")
    want = op.reference([np.zeros((2, 4, 13, 7)), x], {})[0]
    sess = ort.InferenceSession(str(res.dir / "model.onnx"), providers=["CPUExecutionProvider"])
    np.testing.assert_allclose(sess.run(None, {sess.get_inputs()[0].name: x})[0], want, atol=1e-6)
    with torch.no_grad():
        t = import_model(res.dir / "model.py").load()(torch.from_numpy(x)).numpy()
    np.testing.assert_allclose(t, want, atol=1e-6)


def _load_ir(art: Path) -> Graph:
    from convert.artifacts import load_graph

    return load_graph(art)


# --- DetectionOutput --------------------------------------------------------------------------

DET_CASES = {  # (detection_output_param, share_location)
    "center_size": "code_type: CENTER_SIZE nms_param { nms_threshold: 0.45 top_k: 40 } keep_top_k: 25 "
                   "confidence_threshold: 0.3",
    "corner": "code_type: CORNER nms_param { nms_threshold: 0.3 top_k: 30 } keep_top_k: 12 confidence_threshold: 0.35",
    "corner_size": "code_type: CORNER_SIZE nms_param { nms_threshold: 0.5 } confidence_threshold: 0.4",
    "encoded": "code_type: CENTER_SIZE variance_encoded_in_target: true nms_param { nms_threshold: 0.4 top_k: 20 } "
               "keep_top_k: 30 confidence_threshold: 0.3",
    "no_background": "background_label_id: -1 code_type: CENTER_SIZE nms_param { nms_threshold: 0.45 top_k: 10 } "
                     "keep_top_k: 8 confidence_threshold: 0.3",
    "background_2": "background_label_id: 2 code_type: CENTER_SIZE nms_param { nms_threshold: 0.45 } "
                    "keep_top_k: 500 confidence_threshold: 0.3",
    "nothing_found": "code_type: CENTER_SIZE nms_param { nms_threshold: 0.45 } keep_top_k: 10 "
                     "confidence_threshold: 0.9999",
}
PER_CLASS = {"corner", "encoded"}  # these also run with share_location: false


# OpenCV 4.14 refuses: CORNER_SIZE (not in its caffe.proto), variance_encoded_in_target with priors
# that carry variances (Caffe takes them), background_label_id -1 with shared locations.
OPENCV_REFUSES = {"corner_size", "encoded", "no_background"}
DET_LIST = [(c, True) for c in DET_CASES] + [(c, False) for c in sorted(PER_CLASS)]


@pytest.mark.parametrize("case,share", DET_LIST, ids=[f"{c}-{'shared' if s else 'per_class'}" for c, s in DET_LIST])
def test_detection_output_agrees_with_opencv(case: str, share: bool, tmp_path: Path) -> None:
    v = _verified(ssd_net(DET_CASES[case], share=share), tmp_path, opencv="any")
    if case in OPENCV_REFUSES:  # verified by the other three
        assert v["opencv"]["status"] == "refused", v["opencv"]
        return
    assert v["opencv"]["ok"] is True, v["opencv"]
    found = int(next(iter(v["opencv"]["compare"].values())).rsplit(": ", 1)[1].split()[0])
    assert (found == 0) == (case == "nothing_found"), found
    assert v["opencv"]["max_rel"] < 1e-4


def test_detection_output_batch_of_two(tmp_path: Path) -> None:
    _verified(ssd_net(DET_CASES["center_size"], shape=(2, 3, 33, 41)), tmp_path)


def test_res10_like_face_detector(tmp_path: Path) -> None:
    """OpenCV's face detector structure: a small residual trunk, Normalize on the first head, two
    heads, two classes (background, face), CENTER_SIZE, keep_top_k 200."""
    t = 'name: "res10ish"\n' + _input("data", (1, 3, 61, 53))
    t += _conv("c1", "data", 8, 3, 2, 1) + _layer("c1r", "ReLU", ["c1"])
    t += _conv("r1", "c1r", 8) + _layer("r1r", "ReLU", ["r1"]) + _conv("r2", "r1r", 8)
    t += _layer("sum", "Eltwise", ["c1r", "r2"]) + _layer("f1", "ReLU", ["sum"])
    t += _layer("f1n", "Normalize", ["f1"], "norm_param { across_spatial: false channel_shared: false }")
    t += _conv("f2", "f1", 8, 3, 2, 1)
    heads = ["min_size: 10 min_size: 16 clip: false variance: 0.1 variance: 0.1 variance: 0.2 variance: 0.2 step: 4",
             "min_size: 24 max_size: 40 aspect_ratio: 2 clip: false variance: 0.1 variance: 0.1 variance: 0.2 "
             "variance: 0.2"]
    net = ssd_net("code_type: CENTER_SIZE nms_param { nms_threshold: 0.45 top_k: 400 } keep_top_k: 200 "
                  "confidence_threshold: 0.6", classes=2, priors=heads, damp=0.2)
    body = net.split("\n", 1)[1].split("\n", 3)[3]  # drop the name, input and the two trunk convolutions
    body = body.replace('bottom: "f1"', 'bottom: "f1n"').replace('bottom: "f1n" top: "f2"', 'bottom: "f1" top: "f2"')
    v = _verified(t + body, tmp_path, "res10ish")
    assert v["opencv"]["max_rel"] < 1e-4


def _graph(op: DetectionOutput, p: int, priors: tuple[int, ...] | None = None) -> Graph:
    g = Graph()
    g.add_input("loc", (1, p * op.locs() * 4))
    g.add_input("conf", (1, p * op.num_classes))
    g.add_input("priors", priors or (1, 2, p * 4))
    g.add(op, ["loc", "conf", "priors"], ["det"], "det")
    g.outputs = ["det"]
    return g


def _all_backends(op: DetectionOutput, feeds: dict[str, np.ndarray], tmp_path: Path) -> list[np.ndarray]:
    import onnxruntime as ort
    import torch

    from convert.onnx_emit import write_onnx

    g = _graph(op, feeds["priors"].shape[2] // 4, feeds["priors"].shape)
    ref = op.reference([feeds[k].astype(np.float64) for k in ("loc", "conf", "priors")], {})[0]
    ns: dict = {}
    exec(compile(model_source(g), "model.py", "exec"), ns)
    with torch.no_grad():
        t = ns["Net"]()(*(torch.from_numpy(feeds[k]) for k in ("loc", "conf", "priors"))).numpy()
    write_onnx(g, tmp_path / "d.onnx")
    o = ort.InferenceSession(str(tmp_path / "d.onnx"), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    return [ref, t, o]


def _feeds(boxes: list[list[float]], scores: list[list[float]]) -> dict[str, np.ndarray]:
    p = len(boxes)
    var = np.ones((p, 4))
    return {"loc": np.zeros((1, p * 4), np.float32), "conf": np.array(scores, np.float32).reshape(1, -1),
            "priors": np.stack([np.array(boxes), var]).reshape(1, 2, -1).astype(np.float32)}


def test_ties_nms_and_keep_top_k_by_hand(tmp_path: Path) -> None:
    """Equal scores keep prior order; overlap 1/3 is kept at threshold 1/3 (<=) and suppressed
    below; keep_top_k takes the best over classes, ties to the lower label."""
    boxes = [[0, 0, 0.4, 0.4], [0.2, 0, 0.6, 0.4], [0, 0, 0.4, 0.4], [0.6, 0.6, 1, 1]]
    scores = [[0, 0.5, 0.2], [0, 0.5, 0.2], [0, 0.4, 0.2], [0, 0.1, 0.2]]
    op = DetectionOutput(3, nms_threshold=1 / 3 + 1e-6, threshold=0.15, keep_top_k=4, code="corner", encoded=True)
    for got in _all_backends(op, _feeds(boxes, scores), tmp_path):
        rows = got.reshape(-1, 7)
        labels_scores = rows[:, 1:3].astype(np.float64).round(6).tolist()
        # class 1: 0 (0.5) keeps, 1 (0.5, overlap 1/3) keeps, 2 (= box 0) suppressed; class 2: all 0.2
        # -> 0, 1 kept (2 suppressed by 0), 3 kept; keep_top_k 4: 0.5, 0.5, then the first two 0.2s
        assert labels_scores == [[1, 0.5], [1, 0.5], [2, 0.2], [2, 0.2]], labels_scores
        np.testing.assert_allclose(rows[2:, 3:], [boxes[0], boxes[1]], atol=1e-6)
    op = DetectionOutput(3, nms_threshold=0.33, threshold=0.15, code="corner", encoded=True, background=2)
    for got in _all_backends(op, _feeds(boxes, scores), tmp_path):
        rows = got.reshape(-1, 7)
        valid = rows[rows[:, 1] >= 0]
        assert valid[:, 1].tolist() == [1], valid  # class 0 not above 0.15, 2 is background, 1/3 > 0.33
        assert rows.shape[0] == op.rows(4) == 8 and (rows[1:, 1:] == -1).all() and (rows[:, 0] == 0).all()


def test_adaptive_eta_by_hand(tmp_path: Path) -> None:
    """eta < 1: the threshold 0.6 becomes 0.3 after the first kept box (0.6 > 0.5), then stays."""
    boxes = [[0, 0, 0.5, 0.5], [0.9, 0.9, 1, 1], [0, 0.1, 0.5, 0.6], [0.2, 0, 0.7, 0.5]]
    scores = [[0, 0.9], [0, 0.8], [0, 0.7], [0, 0.6]]
    feeds = _feeds(boxes, scores)
    # overlaps with box 0: box 2 0.2/0.3 = 0.667, box 3 0.15/0.35 = 0.429
    for eta, want in ((0.5, [0.9, 0.8]), (1.0, [0.9, 0.8, 0.6])):
        op = DetectionOutput(2, nms_threshold=0.6, eta=eta, threshold=0.0, code="corner", encoded=True)
        for got in _all_backends(op, feeds, tmp_path):
            rows = got.reshape(-1, 7).astype(np.float64)
            assert rows[rows[:, 1] >= 0][:, 2].round(6).tolist() == want, (eta, rows)


def test_eta_in_a_converted_net(tmp_path: Path) -> None:
    _verified(ssd_net("code_type: CENTER_SIZE nms_param { nms_threshold: 0.7 eta: 0.8 top_k: 30 } "
                      "confidence_threshold: 0.3"), tmp_path, opencv="any")


def test_inverted_and_empty_boxes_by_hand(tmp_path: Path) -> None:
    """CORNER codes can give xmax < xmin: Caffe's overlap is 0 unless the intersection has positive
    width and height, so an inverted box and boxes of size 0 never suppress nor get suppressed."""
    boxes = [[0.5, 0.5, 0.2, 0.2], [0.2, 0.2, 0.5, 0.5], [0.3, 0.3, 0.3, 0.3], [0.3, 0.3, 0.3, 0.3],
             [0.21, 0.21, 0.5, 0.5], [0.5, 0.2, 0.2, 0.5]]
    scores = [[0, 0.9], [0, 0.8], [0, 0.7], [0, 0.65], [0, 0.6], [0, 0.55]]
    op = DetectionOutput(2, nms_threshold=0.5, threshold=0.0, code="corner", encoded=True)
    for got in _all_backends(op, _feeds(boxes, scores), tmp_path):
        rows = got.reshape(-1, 7).astype(np.float64)
        assert rows[rows[:, 1] >= 0][:, 2].round(6).tolist() == [0.9, 0.8, 0.7, 0.65, 0.55], rows


def test_unnormalized_pixel_boxes_by_hand(tmp_path: Path) -> None:
    """OpenCV's normalized_bbox: false, priors (1, 1, P*4, 1) without variances (encoded):
    center_size with zero offsets turns prior [0, 0, 9, 9] (10 pixels wide: +1) into [0, 0, 10, 10]
    (centre xmin + 10/2); overlaps count (w + 1) * (h + 1): [0, 0, 10, 10] and [5, 0, 15, 10]
    overlap 66 / 176 = 0.375 (normalized counting: 1/3), touching [10, 0, 20, 10] 11 / 231."""
    priors = [[0, 0, 9, 9], [5, 0, 14, 9], [10, 0, 19, 9]]
    scores = [[0, 0.9, 0.9], [0, 0.8, 0.1], [0, 0.1, 0.8]]
    feeds = {"loc": np.zeros((1, 12), np.float32), "conf": np.array(scores, np.float32).reshape(1, -1),
             "priors": np.array(priors, np.float32).reshape(1, 1, 12, 1)}
    a, b, c = [0, 0, 10, 10], [5, 0, 15, 10], [10, 0, 20, 10]
    for nms, want in ((0.36, [[1, 0.9, *a], [2, 0.9, *a], [2, 0.8, *c]]),  # b suppressed, c kept
                      (0.38, [[1, 0.9, *a], [1, 0.8, *b], [2, 0.9, *a], [2, 0.8, *c]]),
                      (0.04, [[1, 0.9, *a], [2, 0.9, *a]])):  # c suppressed: 11/231 = 0.048
        op = DetectionOutput(3, nms_threshold=nms, threshold=0.5, code="center_size", encoded=True, normalized=False)
        for got in _all_backends(op, feeds, tmp_path):
            rows = got.reshape(-1, 7).astype(np.float64)
            np.testing.assert_allclose(rows[rows[:, 1] >= 0][:, 1:], want, atol=1e-6, err_msg=str(nms))


def test_unnormalized_corner_size_is_refused(tmp_path: Path) -> None:
    src = tmp_path / "n.prototxt"
    text = ssd_net("code_type: CORNER_SIZE normalized_bbox: false")
    src.write_text(text)
    with pytest.raises(Unsupported, match="CORNER_SIZE"):
        convert(src, out=tmp_path / "out")


@pytest.mark.parametrize("params,match", [
    ("prior_box_param { min_size: 0 }", "min_size"),
    ("prior_box_param { min_size: 10 max_size: 5 }", "max_size"),
    ("prior_box_param { min_size: 10 variance: 0.1 variance: 0.2 }", "variance"),
    ("prior_box_param { min_size: 10 img_h: 30 }", "img_h"),
    ("prior_box_param { min_size: 10 aspect_ratio: -2 }", "aspect_ratio"),
])
def test_bad_prior_box(params: str, match: str, tmp_path: Path) -> None:
    src = tmp_path / "bad.prototxt"
    src.write_text('name: "pb"\n' + _input("data", (1, 3, 9, 9)) + _layer("pb", "PriorBox", ["data", "data"], params))
    with pytest.raises(BadModel, match=match):
        convert(src, out=tmp_path / "out")


@pytest.mark.parametrize("params,match", [
    ("share_location: true", "num_classes"),
    ("num_classes: 4", "conf"),  # the net's conf holds 3 classes per prior
    ("num_classes: 3 nms_param { eta: 1.5 }", "eta"),
    ("num_classes: 3 nms_param { nms_threshold: -0.1 }", "nms_threshold"),
])
def test_bad_detection_output(params: str, match: str, tmp_path: Path) -> None:
    src = tmp_path / "bad.prototxt"
    text = ssd_net("")
    src.write_text(text[:text.rindex("detection_output_param")] + f"detection_output_param {{ {params} }} }}\n")
    with pytest.raises(BadModel, match=match):
        convert(src, out=tmp_path / "out")


def test_detection_metrics() -> None:
    a = np.array([[0, 1, 0.9, 0.1, 0.1, 0.5, 0.5], [0, 1, 0.9, 0.2, 0.2, 0.6, 0.6], [0, -1, -1, -1, -1, -1, -1]])
    b = np.array([[0, 1, 0.9, 0.2, 0.2, 0.6, 0.6], [0, 1, 0.9, 0.1, 0.1, 0.5, 0.50001], [0, 0, 0, 0, 0, 0, 0]])
    m = det_metrics(a, b)
    assert m["detections"] == 2 and m["max_rel"] == pytest.approx(1e-5)
    assert math.isinf(det_metrics(a, b[:1])["max_rel"])
    assert math.isinf(det_metrics(a, b * [1, 2, 1, 1, 1, 1, 1])["max_rel"])


# --- the corpus SSD files ---------------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.parametrize("path", SSD_FILES, ids=["opencv_extra_ssd_vgg16", "gpu_rest_engine_ssd300"])
def test_corpus_ssd_agrees_with_opencv(path: Path, tmp_path: Path) -> None:
    pytest.importorskip("cv2")
    if not path.is_file():
        pytest.skip("corpus absent")
    # random weights give no score above 0.5: a lower threshold makes the seeded net detect
    text = path.read_text().replace("confidence_threshold: 0.5", "confidence_threshold: 0.02")
    v = _verified(text, tmp_path, "ssd")
    assert v["opencv"]["max_rel"] < 1e-4


FASTER_RCNN_ZF = CORPUS / "realworld/opencv_extra-dnn/faster_rcnn_zf.prototxt"
CONST_IM_INFO = """
layer { name: "info_split" type: "Slice" bottom: "im_info_seed" top: "info_hw" top: "info_s"
  slice_param { axis: 1 slice_point: 2 } }
layer { name: "info_hw_c" type: "Power" bottom: "info_hw" top: "info_hw_c" power_param { scale: 0 shift: 128 } }
layer { name: "info_s_c" type: "Power" bottom: "info_s" top: "info_s_c" power_param { scale: 0 shift: 0.01 } }
layer { name: "im_info" type: "Concat" bottom: "info_hw_c" bottom: "info_s_c" top: "im_info" }
"""


def test_faster_rcnn_unnormalized_detection_output_agrees_with_opencv(tmp_path: Path) -> None:
    """OpenCV's faster_rcnn_zf.prototxt: DetectionOutput with normalized_bbox: false on the R-CNN
    head (priors: the proposals, in pixels), seeded weights at 128 x 128, through the normal
    verification. im_info is made the constant [128, 128, 0.01] in-net (Slice, Power, Concat: a
    seeded im_info gives no proposals) and the class logits are scaled by 20 (random weights give
    near-uniform scores, whose near-ties float32 breaks its own way): 100 real detections."""
    pytest.importorskip("cv2")
    if not FASTER_RCNN_ZF.is_file():
        pytest.skip("corpus absent")
    text = FASTER_RCNN_ZF.read_text().replace('input: "im_info"', 'input: "im_info_seed"', 1)
    i = text.index("#========= conv1")
    text = text[:i] + CONST_IM_INFO + text[i:]
    j = text.index('name: "cls_prob"')
    k = text.rindex("layer", 0, j)
    scaled = 'layer { name: "cls_score_x" type: "Power" bottom: "cls_score" top: "cls_score_x" ' \
        'power_param { scale: 20 } }\n'
    text = text[:k] + scaled + text[k:j] + text[j:].replace('bottom: "cls_score"', 'bottom: "cls_score_x"', 1)
    src = tmp_path / "zf.prototxt"
    src.write_text(text)
    res = convert(src, out=tmp_path / "out", shapes={"data": (1, 3, 128, 128), "im_info_seed": (1, 3)})
    v = res.report["verification"]["backends"]
    assert res.report["status"] == "verified", v
    for backend in ("pytorch", "onnxruntime", "opencv"):
        assert v[backend]["ok"] is True and v[backend]["max_rel"] < 1e-4, (backend, v[backend])
        assert v[backend]["compare"]["detection_out"].endswith(": 100 found"), v[backend]


def test_pixel_boxes_do_not_hide_a_wrong_score() -> None:
    """Coordinates in pixels scale the box differences, never the score's (0.9 against 0.5)."""
    ref = np.array([[[[0, 1, 0.9, 10, 20, 300, 400]]]])
    out = ref.copy()
    out[..., 2] = 0.5
    assert det_metrics(ref, out)["max_rel"] == pytest.approx(0.4)
    out = ref.copy()
    out[..., 5] += 0.04  # 0.04 px on a 400 px scale
    assert det_metrics(ref, out)["max_rel"] == pytest.approx(1e-4)


def test_a_conf_blob_without_axes_is_refused() -> None:
    op = DetectionOutput(2)
    with pytest.raises(ShapeError, match="batch axis"):
        op.infer([(1, 8), (), (1, 2, 8)], {})
