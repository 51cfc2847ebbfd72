"""Write a ResNet-18 with random weights as ONNX, and an input for it: the files the docs use.

    python examples/make_resnet18.py            # resnet18.onnx (1x3x224x224 -> 1x1000), in.npz
    python examples/make_resnet18.py --small    # the same layers, 32x32 images, 1/4 the width

The model is built with onnx.helper (torchvision's layout: Conv, BatchNormalization, Relu,
MaxPool, Add, GlobalAveragePool, Flatten, Gemm), so it needs nothing beyond kiln's own
dependencies: no torch, no download. Its input is named ``image`` and its output ``logits``;
``in.npz`` holds one random ``image`` for ``kiln run --inputs`` and ``np.load``.
"""

from __future__ import annotations

import argparse

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def resnet18(size: int = 224, classes: int = 1000, width: int = 64, seed: int = 18
             ) -> onnx.ModelProto:
    """ResNet-18 (He et al.) for one ``size``x``size`` image, its stages ``width`` to
    ``8 * width`` channels wide; He-initialized random weights."""
    rng = np.random.default_rng(seed)
    nodes: list[onnx.NodeProto] = []
    inits: list[onnx.TensorProto] = []

    def weight(name: str, *shape: int, scale: float = 1.0) -> str:
        fan_in = int(np.prod(shape[1:])) if len(shape) > 1 else 1
        value = rng.standard_normal(shape) * scale * np.sqrt(2.0 / fan_in)
        inits.append(numpy_helper.from_array(value.astype("float32"), name))
        return name

    def conv_bn(x: str, name: str, c_in: int, c_out: int, k: int, stride: int,
                relu: bool) -> str:
        nodes.append(helper.make_node(
            "Conv", [x, weight(f"{name}.weight", c_out, c_in, k, k)], [f"{name}.conv"],
            name=f"{name}.conv", kernel_shape=[k, k], strides=[stride, stride],
            pads=[k // 2] * 4))
        var = numpy_helper.from_array((rng.random(c_out) + 0.5).astype("float32"),
                                      f"{name}.bn.var")
        inits.append(var)
        stats = [weight(f"{name}.bn.scale", c_out, scale=0.5), weight(f"{name}.bn.bias", c_out,
                 scale=0.05), weight(f"{name}.bn.mean", c_out, scale=0.05), var.name]
        nodes.append(helper.make_node("BatchNormalization", [f"{name}.conv", *stats],
                                      [f"{name}.bn"], name=f"{name}.bn"))
        if not relu:
            return f"{name}.bn"
        nodes.append(helper.make_node("Relu", [f"{name}.bn"], [f"{name}.relu"],
                                      name=f"{name}.relu"))
        return f"{name}.relu"

    x = conv_bn("image", "conv1", 3, width, 7, 2, True)
    nodes.append(helper.make_node("MaxPool", [x], ["pool1"], name="pool1", kernel_shape=[3, 3],
                                  strides=[2, 2], pads=[1, 1, 1, 1]))
    x, c_in = "pool1", width
    for stage, c_out in enumerate([width, 2 * width, 4 * width, 8 * width], start=1):
        for block in range(2):
            name = f"layer{stage}.{block}"
            stride = 2 if stage > 1 and block == 0 else 1
            h = conv_bn(x, f"{name}.conv1", c_in, c_out, 3, stride, True)
            h = conv_bn(h, f"{name}.conv2", c_out, c_out, 3, 1, False)
            shortcut = (conv_bn(x, f"{name}.downsample", c_in, c_out, 1, stride, False)
                        if stride != 1 or c_in != c_out else x)
            nodes.append(helper.make_node("Add", [h, shortcut], [f"{name}.add"],
                                          name=f"{name}.add"))
            nodes.append(helper.make_node("Relu", [f"{name}.add"], [f"{name}.out"],
                                          name=f"{name}.out"))
            x, c_in = f"{name}.out", c_out
    nodes.append(helper.make_node("GlobalAveragePool", [x], ["gap"], name="gap"))
    nodes.append(helper.make_node("Flatten", ["gap"], ["flat"], name="flatten"))
    nodes.append(helper.make_node("Gemm", ["flat", weight("fc.weight", classes, c_in, scale=0.5),
                                           weight("fc.bias", classes, scale=0.05)],
                                  ["logits"], name="fc", transB=1))
    graph = helper.make_graph(
        nodes, "resnet18",
        [helper.make_tensor_value_info("image", TensorProto.FLOAT, [1, 3, size, size])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, classes])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)],
                              producer_name="kiln examples/make_resnet18.py")
    onnx.checker.check_model(model)
    return model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--small", action="store_true",
                        help="32x32 images, 16 to 128 channels, 10 classes: the same layers, "
                             "quick to compile (for tests)")
    parser.add_argument("-o", "--output", default="resnet18.onnx", help="the ONNX file")
    parser.add_argument("--inputs", default="in.npz", help="the .npz with one input")
    args = parser.parse_args()
    size, classes, width = (32, 10, 16) if args.small else (224, 1000, 64)
    onnx.save(resnet18(size, classes, width), args.output)
    image = np.random.default_rng(0).random((1, 3, size, size)).astype("float32")
    np.savez(args.inputs, image=image)
    print(f"wrote {args.output} (ResNet-18, image float32[1, 3, {size}, {size}] -> "
          f"logits float32[1, {classes}]) and {args.inputs}")


if __name__ == "__main__":
    main()
