"""Writes the zoo's Caffe definitions (prototxt/*.prototxt) from compact descriptions.

    python -m zoo.prototxt_gen          # rewrites prototxt/ in place

The files are committed; this generator only saves typing the long ones (ResNets, GoogLeNet).
"""

from __future__ import annotations

import sys
from pathlib import Path

OUT = Path(__file__).resolve().parents[1] / "prototxt"


class Net:
    """Accumulates V2 layers; each method returns the name of its top blob."""

    def __init__(self, name: str, shape: tuple[int, ...], comment: str) -> None:
        self.lines = [f"# {line}" for line in comment.strip().splitlines()]
        self.lines += [f'name: "{name}"', "layer {", '  name: "data"', '  type: "Input"',
                       '  top: "data"', "  input_param { shape { "
                       + " ".join(f"dim: {d}" for d in shape) + " } }", "}"]

    def layer(self, name: str, typ: str, bottoms: list[str], top: str, params: str = "") -> str:
        self.lines += ["layer {", f'  name: "{name}"', f'  type: "{typ}"']
        self.lines += [f'  bottom: "{b}"' for b in bottoms] + [f'  top: "{top}"']
        if params:
            self.lines.append(f"  {params}")
        self.lines.append("}")
        return top

    def conv(self, name: str, x: str, n: int, k: int, s: int = 1, p: int = 0, g: int = 1,
             bias: bool = True, top: str | None = None) -> str:
        opts = [f"num_output: {n}", f"kernel_size: {k}"]
        opts += [f"stride: {s}"] if s != 1 else []
        opts += [f"pad: {p}"] if p else []
        opts += [f"group: {g}"] if g != 1 else []
        opts += ["bias_term: false"] if not bias else []
        return self.layer(name, "Convolution", [x], top or name,
                          "convolution_param { " + " ".join(opts) + " }")

    def relu(self, name: str, x: str) -> str:
        return self.layer(name, "ReLU", [x], x)

    def pool(self, name: str, x: str, k: int, s: int, kind: str = "MAX", p: int = 0,
             global_: bool = False) -> str:
        if global_:
            opts = f"pool: {kind} global_pooling: true"
        else:
            opts = f"pool: {kind} kernel_size: {k} stride: {s}" + (f" pad: {p}" if p else "")
        return self.layer(name, "Pooling", [x], name, "pooling_param { " + opts + " }")

    def lrn(self, name: str, x: str) -> str:
        return self.layer(name, "LRN", [x], name,
                          "lrn_param { local_size: 5 alpha: 0.0001 beta: 0.75 }")

    def fc(self, name: str, x: str, n: int) -> str:
        return self.layer(name, "InnerProduct", [x], name, f"inner_product_param {{ num_output: {n} }}")

    def dropout(self, name: str, x: str, ratio: float = 0.5) -> str:
        return self.layer(name, "Dropout", [x], x, f"dropout_param {{ dropout_ratio: {ratio} }}")

    def bn(self, name: str, x: str) -> str:
        """Caffe's BatchNorm (statistics) + Scale (learned affine), in place as ResNets ship it."""
        self.layer(f"bn{name}", "BatchNorm", [x], x, "batch_norm_param { use_global_stats: true }")
        return self.layer(f"scale{name}", "Scale", [x], x, "scale_param { bias_term: true }")

    def bn_to(self, name: str, x: str, top: str) -> str:
        self.layer(f"bn{name}", "BatchNorm", [x], top, "batch_norm_param { use_global_stats: true }")
        return self.layer(f"scale{name}", "Scale", [top], top, "scale_param { bias_term: true }")

    def add(self, name: str, a: str, b: str) -> str:
        return self.layer(name, "Eltwise", [a, b], name, "eltwise_param { operation: SUM }")

    def head(self, x: str, classes: int = 1000, fcs: tuple[int, ...] = (4096, 4096)) -> None:
        for i, n in enumerate(fcs, start=6):
            x = self.relu(f"relu{i}", self.fc(f"fc{i}", x, n))
            x = self.dropout(f"drop{i}", x)
        self.layer("prob", "Softmax", [self.fc(f"fc{6 + len(fcs)}", x, classes)], "prob")

    def text(self) -> str:
        return "\n".join(self.lines) + "\n"


def alexnet() -> Net:
    n = Net("AlexNet", (1, 3, 227, 227), """
AlexNet as BVLC shipped it (bvlc_alexnet): grouped conv2/4/5 and LRN after conv1 and conv2.
Krizhevsky, Sutskever, Hinton, "ImageNet Classification with Deep CNNs", NIPS 2012.""")
    x = n.relu("relu1", n.conv("conv1", "data", 96, 11, s=4))
    x = n.pool("pool1", n.lrn("norm1", x), 3, 2)
    x = n.relu("relu2", n.conv("conv2", x, 256, 5, p=2, g=2))
    x = n.pool("pool2", n.lrn("norm2", x), 3, 2)
    x = n.relu("relu3", n.conv("conv3", x, 384, 3, p=1))
    x = n.relu("relu4", n.conv("conv4", x, 384, 3, p=1, g=2))
    x = n.relu("relu5", n.conv("conv5", x, 256, 3, p=1, g=2))
    n.head(n.pool("pool5", x, 3, 2))
    return n


def alexnet_owt() -> Net:
    n = Net("AlexNet-OWT", (1, 3, 224, 224), """
AlexNet, "One Weird Trick" variant (Krizhevsky 2014, arXiv:1404.5997) as convnet-benchmarks timed it:
64-192-384-256-256 channels, no LRN, no groups.""")
    x = n.pool("pool1", n.relu("relu1", n.conv("conv1", "data", 64, 11, s=4, p=2)), 3, 2)
    x = n.pool("pool2", n.relu("relu2", n.conv("conv2", x, 192, 5, p=2)), 3, 2)
    x = n.relu("relu3", n.conv("conv3", x, 384, 3, p=1))
    x = n.relu("relu4", n.conv("conv4", x, 256, 3, p=1))
    x = n.relu("relu5", n.conv("conv5", x, 256, 3, p=1))
    n.head(n.pool("pool5", x, 3, 2))
    return n


def overfeat_fast() -> Net:
    n = Net("Overfeat-fast", (1, 3, 231, 231), """
OverFeat "fast" model (Sermanet et al. 2014, arXiv:1312.6229) at 231x231, as convnet-benchmarks timed it.""")
    x = n.pool("pool1", n.relu("relu1", n.conv("conv1", "data", 96, 11, s=4)), 2, 2)
    x = n.pool("pool2", n.relu("relu2", n.conv("conv2", x, 256, 5)), 2, 2)
    x = n.relu("relu3", n.conv("conv3", x, 512, 3, p=1))
    x = n.relu("relu4", n.conv("conv4", x, 1024, 3, p=1))
    x = n.relu("relu5", n.conv("conv5", x, 1024, 3, p=1))
    n.head(n.pool("pool5", x, 2, 2), fcs=(3072, 4096))
    return n


VGG = {"vgg-a": [[64], [128], [256, 256], [512, 512], [512, 512]],
       "vgg16": [[64, 64], [128, 128], [256] * 3, [512] * 3, [512] * 3],
       "vgg19": [[64, 64], [128, 128], [256] * 4, [512] * 4, [512] * 4]}


def vgg(name: str) -> Net:
    label = {"vgg-a": "VGG-A (11 weight layers)", "vgg16": "VGG-16 (configuration D)",
             "vgg19": "VGG-19 (configuration E)"}[name]
    n = Net(name.upper(), (1, 3, 224, 224), f"""
{label}: Simonyan & Zisserman, "Very Deep Convolutional Networks", ICLR 2015 (arXiv:1409.1556).""")
    x = "data"
    for stage, widths in enumerate(VGG[name], start=1):
        for i, w in enumerate(widths, start=1):
            x = n.relu(f"relu{stage}_{i}", n.conv(f"conv{stage}_{i}", x, w, 3, p=1))
        x = n.pool(f"pool{stage}", x, 2, 2)
    n.head(x)
    return n


INCEPTION = {  # name: (1x1, 3x3 reduce, 3x3, 5x5 reduce, 5x5, pool proj)
    "3a": (64, 96, 128, 16, 32, 32), "3b": (128, 128, 192, 32, 96, 64),
    "4a": (192, 96, 208, 16, 48, 64), "4b": (160, 112, 224, 24, 64, 64),
    "4c": (128, 128, 256, 24, 64, 64), "4d": (112, 144, 288, 32, 64, 64),
    "4e": (256, 160, 320, 32, 128, 128), "5a": (256, 160, 320, 32, 128, 128),
    "5b": (384, 192, 384, 48, 128, 128),
}


def googlenet() -> Net:
    n = Net("GoogLeNet", (1, 3, 224, 224), """
GoogLeNet / Inception-v1 as BVLC shipped it (bvlc_googlenet deploy: no auxiliary classifiers).
Szegedy et al., "Going Deeper with Convolutions", CVPR 2015.""")
    x = n.relu("conv1/relu_7x7", n.conv("conv1/7x7_s2", "data", 64, 7, s=2, p=3))
    x = n.lrn("pool1/norm1", n.pool("pool1/3x3_s2", x, 3, 2))
    x = n.relu("conv2/relu_3x3_reduce", n.conv("conv2/3x3_reduce", x, 64, 1))
    x = n.relu("conv2/relu_3x3", n.conv("conv2/3x3", x, 192, 3, p=1))
    x = n.pool("pool2/3x3_s2", n.lrn("conv2/norm2", x), 3, 2)
    for name, cfg in INCEPTION.items():
        if name in ("4a", "5a"):
            x = n.pool(f"pool{name[0]}/3x3_s2", x, 3, 2)
        x = _inception(n, f"inception_{name}", x, cfg)
    x = n.pool("pool5/7x7_s1", x, 7, 1, kind="AVE")
    x = n.dropout("pool5/drop_7x7_s1", x, 0.4)
    n.layer("prob", "Softmax", [n.fc("loss3/classifier", x, 1000)], "prob")
    return n


def _inception(n: Net, p: str, x: str, cfg: tuple[int, ...]) -> str:
    c1, r3, c3, r5, c5, pp = cfg
    a = n.relu(f"{p}/relu_1x1", n.conv(f"{p}/1x1", x, c1, 1))
    b = n.relu(f"{p}/relu_3x3_reduce", n.conv(f"{p}/3x3_reduce", x, r3, 1))
    b = n.relu(f"{p}/relu_3x3", n.conv(f"{p}/3x3", b, c3, 3, p=1))
    c = n.relu(f"{p}/relu_5x5_reduce", n.conv(f"{p}/5x5_reduce", x, r5, 1))
    c = n.relu(f"{p}/relu_5x5", n.conv(f"{p}/5x5", c, c5, 5, p=2))
    d = n.pool(f"{p}/pool", x, 3, 1, p=1)
    d = n.relu(f"{p}/relu_pool_proj", n.conv(f"{p}/pool_proj", d, pp, 1))
    return n.layer(f"{p}/output", "Concat", [a, b, c, d], f"{p}/output")


RESNET = {18: ("basic", [2, 2, 2, 2]), 34: ("basic", [3, 4, 6, 3]),
          50: ("bottleneck", [3, 4, 6, 3]), 101: ("bottleneck", [3, 4, 23, 3]),
          152: ("bottleneck", [3, 8, 36, 3]), 200: ("preact", [3, 24, 36, 3])}


def resnet(depth: int) -> Net:
    kind, blocks = RESNET[depth]
    about = {"basic": "basic blocks (two 3x3 convolutions), projection shortcuts when the shape changes",
             "bottleneck": "bottleneck blocks as KaimingHe's Caffe release (stride on the first 1x1)",
             "preact": "pre-activation bottleneck blocks (He et al., Identity Mappings, ECCV 2016)"}[kind]
    n = Net(f"ResNet-{depth}", (1, 3, 224, 224), f"""
ResNet-{depth}: He et al., "Deep Residual Learning for Image Recognition", CVPR 2016;
{about}.""")
    x = n.relu("conv1_relu", n.bn("_conv1", n.conv("conv1", "data", 64, 7, s=2, p=3, bias=False)))
    x = n.pool("pool1", x, 3, 2)  # Caffe rounds up: 112 -> 56 without padding
    width = 64
    for stage, count in enumerate(blocks, start=2):
        for i in range(count):
            stride = 2 if i == 0 and stage > 2 else 1
            name = f"res{stage}{chr(ord('a') + i) if count <= 26 else f'b{i}'}"
            block = {"basic": _basic, "bottleneck": _bottleneck, "preact": _preact}[kind]
            x = block(n, name, x, width, stride, i == 0)
        width *= 2
    if kind == "preact":
        x = n.relu("post_relu", n.bn("_post", x))
    x = n.pool("pool5", x, 0, 0, kind="AVE", global_=True)
    n.layer("prob", "Softmax", [n.fc("fc1000", x, 1000)], "prob")
    return n


def _basic(n: Net, name: str, x: str, w: int, stride: int, first: bool) -> str:
    short = x
    if first and (stride != 1 or name != "res2a"):
        short = n.bn(f"{name}_branch1", n.conv(f"{name}_branch1", x, w, 1, s=stride, bias=False))
    y = n.relu(f"{name}_branch2a_relu",
               n.bn(f"{name}_branch2a", n.conv(f"{name}_branch2a", x, w, 3, s=stride, p=1, bias=False)))
    y = n.bn(f"{name}_branch2b", n.conv(f"{name}_branch2b", y, w, 3, p=1, bias=False))
    return n.relu(f"{name}_relu", n.add(name, short, y))


def _bottleneck(n: Net, name: str, x: str, w: int, stride: int, first: bool) -> str:
    short = x
    if first:
        short = n.bn(f"{name}_branch1", n.conv(f"{name}_branch1", x, 4 * w, 1, s=stride, bias=False))
    y = n.relu(f"{name}_branch2a_relu",
               n.bn(f"{name}_branch2a", n.conv(f"{name}_branch2a", x, w, 1, s=stride, bias=False)))
    y = n.relu(f"{name}_branch2b_relu",
               n.bn(f"{name}_branch2b", n.conv(f"{name}_branch2b", y, w, 3, p=1, bias=False)))
    y = n.bn(f"{name}_branch2c", n.conv(f"{name}_branch2c", y, 4 * w, 1, bias=False))
    return n.relu(f"{name}_relu", n.add(name, short, y))


def _preact(n: Net, name: str, x: str, w: int, stride: int, first: bool) -> str:
    """BN-ReLU-conv ordering (fb.resnet.torch's preresnet): the very first block reads the stem's
    activation as it is, other first blocks activate before both branches (the shortcut is a
    projection), the rest activate inside the residual branch only."""
    if name == "res2a":
        act = x
    else:
        act = n.relu(f"{name}_pre_relu", n.bn_to(f"{name}_pre", x, f"{name}_pre"))
    short = n.conv(f"{name}_branch1", act if first else x, 4 * w, 1, s=stride, bias=False) \
        if first else x
    y = n.conv(f"{name}_branch2a", act, w, 1, bias=False)
    y = n.relu(f"{name}_branch2a_relu", n.bn(f"{name}_branch2a", y))
    y = n.conv(f"{name}_branch2b", y, w, 3, s=stride, p=1, bias=False)
    y = n.relu(f"{name}_branch2b_relu", n.bn(f"{name}_branch2b", y))
    y = n.conv(f"{name}_branch2c", y, 4 * w, 1, bias=False)
    return n.add(name, short, y)


NETS = {
    "alexnet": alexnet, "alexnet-owt": alexnet_owt, "overfeat-fast": overfeat_fast,
    "vgg-a": lambda: vgg("vgg-a"), "vgg16": lambda: vgg("vgg16"), "vgg19": lambda: vgg("vgg19"),
    "googlenet": googlenet,
    **{f"resnet{d}": (lambda d=d: resnet(d)) for d in RESNET},
}


def main(out: Path = OUT) -> None:
    out.mkdir(exist_ok=True)
    for name, make in NETS.items():
        (out / f"{name}.prototxt").write_text(make().text())
        print(f"wrote {out / name}.prototxt")


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else OUT)
