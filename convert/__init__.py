"""zoo's converter: Caffe and Torch7 model files in, IR graph, PyTorch and ONNX artifacts out."""

__version__ = "0.1.0"
