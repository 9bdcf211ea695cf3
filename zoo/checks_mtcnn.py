"""The real trained MTCNN nets (corpus/trained/mtcnn): converted with their weights, then run through the generated
model.py and OpenCV's readNetFromCaffe at PNet's image pyramid on a drawn face and two real non-face images."""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from convert.api import convert
from convert.torch_emit import import_model

from .checks_common import CORPUS, OUT

NETS = CORPUS / "trained" / "mtcnn"
NEGATIVES = CORPUS / "realworld" / "ikkiChung" / "Prediction-Example-With-Caffe" / "examples" / "images"


def draw_face() -> np.ndarray:
    """A 320x240 RGB image: a frontal face (about 160x200 px) on a textured background."""
    import cv2

    rng = np.random.default_rng(0)
    yy, xx = np.mgrid[0:240, 0:320]
    bg = 90 + 40 * np.sin(xx / 23.0) * np.cos(yy / 31.0) + rng.normal(0, 6, (240, 320))
    img = np.stack([bg * 0.8, bg * 0.9, bg], -1).clip(0, 255).astype(np.uint8)  # RGB, bluish grey
    c = (160, 125)
    cv2.ellipse(img, (160, 232), (55, 40), 0, 0, 360, (205, 150, 120), -1)  # neck
    cv2.ellipse(img, (160, 105), (88, 100), 0, 0, 360, (60, 40, 25), -1)  # hair behind the head
    cv2.ellipse(img, c, (78, 100), 0, 0, 360, (224, 172, 140), -1)  # skin
    cv2.ellipse(img, (160, 45), (80, 35), 0, 180, 360, (60, 40, 25), -1)  # fringe
    for s in (-1, 1):
        ex = 160 + s * 33
        cv2.ellipse(img, (ex, 90), (20, 5), 0, 180, 360, (80, 55, 35), 3)  # eyebrow
        cv2.ellipse(img, (ex, 110), (16, 8), 0, 0, 360, (245, 245, 240), -1)  # eye white
        cv2.circle(img, (ex, 110), 7, (70, 45, 30), -1)  # iris
        cv2.circle(img, (ex, 110), 3, (10, 10, 10), -1)  # pupil
        cv2.ellipse(img, (160 + s * 80, 125), (9, 18), 0, 0, 360, (214, 160, 128), -1)  # ear
    cv2.ellipse(img, (160, 150), (14, 8), 0, 0, 180, (190, 130, 105), -1)  # nose tip shading
    cv2.line(img, (152, 112), (150, 148), (200, 145, 115), 3)  # nose side
    cv2.ellipse(img, (160, 178), (26, 9), 0, 0, 360, (170, 70, 70), -1)  # lips
    cv2.line(img, (136, 178), (184, 178), (110, 40, 40), 2)  # mouth line
    return cv2.GaussianBlur(img, (3, 3), 0)


def negative(name: str) -> np.ndarray:
    import cv2

    im = cv2.cvtColor(cv2.imread(str(NEGATIVES / f"{name}.png"), cv2.IMREAD_COLOR), cv2.COLOR_BGR2RGB)
    return cv2.resize(im, (240, 240), interpolation=cv2.INTER_CUBIC)


def blob(img: np.ndarray) -> np.ndarray:
    """RGB HxWx3 (or NxHxWx3) -> N x 3 x W x H, scaled as MTCNN's MATLAB code (which transposes W and H)."""
    x = (img.astype(np.float32) - 127.5) * 0.0078125
    x = x[None] if x.ndim == 3 else x
    return np.ascontiguousarray(x.transpose(0, 3, 2, 1))


def nms(boxes: np.ndarray, thr: float) -> np.ndarray:
    order, keep = np.argsort(-boxes[:, 4]), []
    area = (boxes[:, 2] - boxes[:, 0] + 1) * (boxes[:, 3] - boxes[:, 1] + 1)
    while order.size:
        i, order = order[0], order[1:]
        keep.append(i)
        w = np.maximum(0, np.minimum(boxes[i, 2], boxes[order, 2]) - np.maximum(boxes[i, 0], boxes[order, 0]) + 1)
        h = np.maximum(0, np.minimum(boxes[i, 3], boxes[order, 3]) - np.maximum(boxes[i, 1], boxes[order, 1]) + 1)
        order = order[w * h / (area[i] + area[order] - w * h) <= thr]
    return boxes[keep]


class Pair:
    """One MTCNN net as the generated model.py and as OpenCV's readNetFromCaffe on the original files."""

    def __init__(self, art: Path, stem: str):
        import cv2
        import torch

        self.torch, self.mod = torch, import_model(art / "model.py")
        self.net = self.mod.load()
        self.cv = cv2.dnn.readNetFromCaffe(str(NETS / f"{stem}.prototxt"), str(NETS / f"{stem}.caffemodel"))

    def __call__(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(prob, regression) from model.py, then from OpenCV."""
        names = self.mod.OUTPUTS
        with self.torch.no_grad():
            outs = [o.numpy() for o in self.net(self.torch.from_numpy(x))]
        self.cv.setInput(x)
        cvs = self.cv.forward(names)
        reg = names.index("conv4-2" if "conv4-2" in names else "conv5-2" if "conv5-2" in names else "conv6-2")
        p = names.index("prob1")
        return outs[p], outs[reg], cvs[p], cvs[reg]


def pyramid(img: np.ndarray, pnet: Pair, minsize: int = 40, factor: float = 0.709) -> tuple[list, np.ndarray]:
    import cv2

    h, w = img.shape[:2]
    m, rows, boxes = 12.0 / minsize, [], []
    minl, k = min(h, w) * m, 0
    while minl >= 12:
        s = m * factor**k
        hs, ws = int(np.ceil(h * s)), int(np.ceil(w * s))
        p, reg, cp, _ = pnet(blob(cv2.resize(img, (ws, hs), interpolation=cv2.INTER_AREA)))
        rows.append({"scale": round(s, 5), "input_hw": [hs, ws], "map_model_py": list(p.shape[2:]),
                     "map_opencv": list(cp.shape[2:]), "max_abs_diff_prob": float(np.abs(p - cp).max()),
                     "max_face_prob": float(p[0, 1].max())})
        i, j = np.nonzero(p[0, 1] >= 0.6)  # i: image x (the input is transposed), j: image y
        if i.size:
            b = np.stack([np.fix((2 * i + 1) / s), np.fix((2 * j + 1) / s), np.fix((2 * i + 12) / s),
                          np.fix((2 * j + 12) / s), p[0, 1, i, j], *reg[0, :, i, j].T], 1)
            boxes.append(nms(b, 0.5))
        minl, k = minl * factor, k + 1
    if not boxes:
        return rows, np.zeros((0, 9))
    b = nms(np.concatenate(boxes), 0.7)
    wh = np.stack([b[:, 2] - b[:, 0], b[:, 3] - b[:, 1]] * 2, 1)
    b[:, :4] += b[:, 5:9] * wh  # box regression, then square as rerec
    side = np.maximum(b[:, 2] - b[:, 0], b[:, 3] - b[:, 1])
    b[:, 0] += (b[:, 2] - b[:, 0] - side) / 2
    b[:, 1] += (b[:, 3] - b[:, 1] - side) / 2
    b[:, 2:4] = b[:, :2] + side[:, None]
    return rows, b


def crops(img: np.ndarray, boxes: np.ndarray, size: int) -> np.ndarray:
    import cv2

    pad = 400
    big = cv2.copyMakeBorder(img, pad, pad, pad, pad, cv2.BORDER_CONSTANT, value=0)
    out = [cv2.resize(big[int(y1) + pad:int(y2) + pad + 1, int(x1) + pad:int(x2) + pad + 1], (size, size),
                      interpolation=cv2.INTER_AREA) for x1, y1, x2, y2 in np.fix(boxes[:, :4])]
    return np.stack(out)


def mtcnn(top: int = 8) -> dict[str, Any]:
    """Convert det1..det3 with their real weights; PNet pyramid and RNet/ONet on the top windows, model.py vs OpenCV."""
    import cv2

    OUT.mkdir(parents=True, exist_ok=True)
    face = draw_face()
    cv2.imwrite(str(OUT / "mtcnn-face.png"), cv2.cvtColor(face, cv2.COLOR_RGB2BGR))
    tmp = Path(tempfile.mkdtemp(prefix="zoo-mtcnn-"))
    result: dict[str, Any] = {"nets": {}, "images": {}}
    try:
        nets = {}
        for stem in ("det1", "det2", "det3"):
            rep = convert(NETS / f"{stem}.prototxt", weights=NETS / f"{stem}.caffemodel", out=tmp).report
            v = rep["verification"]
            sizes = rep.get("verification_sizes") or []
            result["nets"][stem] = {
                "status": rep["status"], "inputs": v.get("inputs"),
                "max_rel": {k: b.get("max_rel", b.get("status")) for k, b in v["backends"].items()},
                "sizes": [{"inputs": s.get("inputs"), "status": s.get("status"),
                           "max_rel": {k: b.get("max_rel", b.get("status")) for k, b in s["backends"].items()}}
                          for s in sizes]}
            assert rep["status"] == "verified", (stem, rep["status"])
            nets[stem] = Pair(tmp / stem, stem)
        for name, img in (("drawn-face", face), ("cat10", negative("cat10")), ("dog10", negative("dog10"))):
            rows, boxes = pyramid(img, nets["det1"])
            entry: dict[str, Any] = {"hw": list(img.shape[:2]), "pnet": rows, "windows": len(boxes)}
            boxes = boxes[np.argsort(-boxes[:, 4])][:top]
            entry["pnet_top"] = [[round(float(t), 1) for t in r[:4]] + [round(float(r[4]), 4)] for r in boxes]
            for stem, size in (("det2", 24), ("det3", 48)):
                if len(boxes):
                    p, _, cp, _ = nets[stem](blob(crops(img, boxes, size)))
                    entry[stem] = {"face_prob": [round(float(t), 4) for t in p[:, 1]],
                                   "face_prob_opencv": [round(float(t), 4) for t in cp[:, 1]],
                                   "max_abs_diff_prob": float(np.abs(p - cp).max())}
            result["images"][name] = entry
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    for stem, n in result["nets"].items():
        sz = "; ".join(f"{s['inputs']}: {s['max_rel']}" for s in n["sizes"])
        print(f"{stem}: {n['status']} {n['max_rel']}  sizes: {sz}")
    print(f"{'image':10s} {'scale':>7s} {'in HxW':>9s} {'py WxH':>8s} {'cv WxH':>8s} {'max|dp|':>9s} {'max p':>7s}")
    for name, e in result["images"].items():
        for r in e["pnet"]:
            print(f"{name:10s} {r['scale']:7.4f} {'x'.join(map(str, r['input_hw'])):>9s} "
                  f"{'x'.join(map(str, r['map_model_py'])):>8s} {'x'.join(map(str, r['map_opencv'])):>8s} "
                  f"{r['max_abs_diff_prob']:9.2e} {r['max_face_prob']:7.4f}")
        print(f"{name}: {e['windows']} PNet windows >= 0.6 after NMS; RNet {e.get('det2', {}).get('face_prob')}; "
              f"ONet {e.get('det3', {}).get('face_prob')}")
    (OUT / "mtcnn.json").write_text(json.dumps(result, indent=2) + "\n")
    print("(maps are W'xH': the input is transposed as in MTCNN's MATLAB code)")
    print(f"wrote {OUT / 'mtcnn.json'}")
    return result
