#!/usr/bin/env python3
"""Builds the real-model ONNX tests under tests/onnx/ with onnx.helper.

Each model directory holds model.onnx, its inputs as NAME.npy (named as the
ONNX inputs) and onnxruntime's outputs as out0.npy, out1.npy, ... The tests
(tools/dlc/tests/onnx.rs) run each model through dlc and compare with those
outputs, so they need neither Python nor onnxruntime. Rerun this script
(`make onnx-models`) after changing a model; its output is deterministic.
"""

import os
import sys

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

OPSET = 17
ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "onnx")


class Builder:
    def __init__(self, seed):
        self.rng = np.random.default_rng(seed)
        self.nodes = []
        self.inits = []
        self.n = 0

    def weight(self, name, shape, scale=None):
        fan_in = shape[-1] if len(shape) < 2 else int(np.prod(shape[1:]))
        scale = scale if scale is not None else 1.0 / np.sqrt(fan_in)
        w = (self.rng.standard_normal(shape) * scale).astype(np.float32)
        self.inits.append(numpy_helper.from_array(w, name))
        return name

    def const(self, name, value):
        self.inits.append(numpy_helper.from_array(np.asarray(value), name))
        return name

    def op(self, op_type, inputs, n_out=1, **attrs):
        outs = []
        for _ in range(n_out):
            self.n += 1
            outs.append(f"{op_type.lower()}_{self.n}")
        self.nodes.append(helper.make_node(op_type, inputs, outs, **attrs))
        return outs[0] if n_out == 1 else outs

    def save(self, name, inputs, output, output_shape, feeds):
        graph = helper.make_graph(
            self.nodes,
            name,
            [helper.make_tensor_value_info(n, TensorProto.FLOAT, list(v.shape)) for n, v in feeds.items()],
            [helper.make_tensor_value_info(output, TensorProto.FLOAT, output_shape)],
            self.inits,
        )
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
        model.ir_version = 8
        onnx.checker.check_model(model, full_check=True)
        d = os.path.join(ROOT, name)
        os.makedirs(d, exist_ok=True)
        onnx.save(model, os.path.join(d, "model.onnx"))
        for n, v in feeds.items():
            np.save(os.path.join(d, f"{n}.npy"), v)
        opts = ort.SessionOptions()
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        sess = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
        for i, out in enumerate(sess.run(None, feeds)):
            np.save(os.path.join(d, f"out{i}.npy"), out)
        print(f"wrote {d}")


def mlp():
    b = Builder(1)
    x = "x"
    h = b.op("Gemm", [x, b.weight("w1", [64, 32]), b.weight("b1", [64])], transB=1)
    h = b.op("Relu", [h])
    h = b.op("Gemm", [h, b.weight("w2", [64, 64]), b.weight("b2", [64])], alpha=0.5, beta=2.0)
    h = b.op("LeakyRelu", [h], alpha=0.1)
    h = b.op("MatMul", [h, b.weight("w3", [64, 10])])
    y = b.op("LogSoftmax", [h], axis=1)
    feeds = {"x": np.random.default_rng(11).standard_normal((8, 32)).astype(np.float32)}
    b.save("mlp", ["x"], y, [8, 10], feeds)


def cnn():
    b = Builder(2)
    h = "image"
    for i, (cin, cout) in enumerate([(3, 8), (8, 16)]):
        h = b.op("Conv", [h, b.weight(f"conv{i}.w", [cout, cin, 3, 3]), b.weight(f"conv{i}.b", [cout])], pads=[1, 1, 1, 1])
        bn = [
            b.const(f"bn{i}.scale", (1 + 0.1 * b.rng.standard_normal(cout)).astype(np.float32)),
            b.const(f"bn{i}.bias", (0.1 * b.rng.standard_normal(cout)).astype(np.float32)),
            b.const(f"bn{i}.mean", (0.1 * b.rng.standard_normal(cout)).astype(np.float32)),
            b.const(f"bn{i}.var", (0.5 + b.rng.random(cout)).astype(np.float32)),
        ]
        h = b.op("BatchNormalization", [h] + bn, epsilon=1e-5)
        h = b.op("Relu", [h])
        h = b.op("MaxPool", [h], kernel_shape=[2, 2], strides=[2, 2])
    # A strided, dilated, asymmetric convolution and a ceil-mode average pool.
    h = b.op("Conv", [h, b.weight("conv2.w", [16, 4, 3, 3])], group=4, dilations=[2, 2], pads=[2, 1, 1, 2])
    h = b.op("AveragePool", [h], kernel_shape=[3, 3], strides=[2, 2], ceil_mode=1, pads=[1, 1, 1, 1])
    h = b.op("GlobalAveragePool", [h])
    h = b.op("Flatten", [h], axis=1)
    y = b.op("Gemm", [h, b.weight("fc.w", [10, 16]), b.weight("fc.b", [10])], transB=1)
    feeds = {"image": np.random.default_rng(12).standard_normal((2, 3, 16, 16)).astype(np.float32)}
    b.save("cnn", ["image"], y, [2, 10], feeds)


def transformer():
    b = Builder(3)
    s, d, heads = 16, 32, 4
    hd = d // heads
    x = "tokens"

    def heads_of(t):
        t = b.op("Reshape", [t, b.const(f"shape{b.n}", np.array([s, heads, hd], np.int64))])
        return b.op("Transpose", [t], perm=[1, 0, 2])

    q = heads_of(b.op("Add", [b.op("MatMul", [x, b.weight("wq", [d, d])]), b.weight("bq", [d])]))
    k = heads_of(b.op("Add", [b.op("MatMul", [x, b.weight("wk", [d, d])]), b.weight("bk", [d])]))
    v = heads_of(b.op("Add", [b.op("MatMul", [x, b.weight("wv", [d, d])]), b.weight("bv", [d])]))
    kt = b.op("Transpose", [k], perm=[0, 2, 1])
    scores = b.op("Div", [b.op("MatMul", [q, kt]), b.const("scale", np.array(np.sqrt(hd), np.float32))])
    attn = b.op("MatMul", [b.op("Softmax", [scores], axis=-1), v])
    merged = b.op("Reshape", [b.op("Transpose", [attn], perm=[1, 0, 2]), b.const("merged", np.array([s, d], np.int64))])
    h = b.op("Add", [x, b.op("MatMul", [merged, b.weight("wo", [d, d])])])
    h = b.op("LayerNormalization", [h, b.const("ln1.g", np.ones(d, np.float32)), b.const("ln1.b", np.zeros(d, np.float32))], axis=-1, epsilon=1e-5)
    f = b.op("Add", [b.op("MatMul", [h, b.weight("w1", [d, 4 * d])]), b.weight("b1", [4 * d])])
    f = b.op("Gelu", [f], approximate="tanh") if OPSET >= 20 else gelu_tanh(b, f)
    f = b.op("Add", [b.op("MatMul", [f, b.weight("w2", [4 * d, d])]), b.weight("b2", [d])])
    y = b.op("LayerNormalization", [b.op("Add", [h, f]), b.weight("ln2.g", [d], 0.1), b.weight("ln2.b", [d], 0.1)], axis=-1, epsilon=1e-5)
    feeds = {"tokens": np.random.default_rng(13).standard_normal((s, d)).astype(np.float32)}
    b.save("transformer", ["tokens"], y, [s, d], feeds)


def gelu_tanh(b, x):
    # 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), as exporters write it.
    c = lambda name, v: b.const(f"{name}{b.n}", np.array(v, np.float32))
    x3 = b.op("Pow", [x, c("three", 3.0)])
    inner = b.op("Mul", [b.op("Add", [x, b.op("Mul", [x3, c("k", 0.044715)])]), c("s", np.sqrt(2 / np.pi))])
    return b.op("Mul", [b.op("Mul", [x, c("half", 0.5)]), b.op("Add", [b.op("Tanh", [inner]), c("one", 1.0)])])


def gru():
    """A GRU unrolled over 6 steps (PyTorch's gate layout), batch 2."""
    b = Builder(4)
    steps, batch, inp, hid = 6, 2, 8, 16
    wx = b.weight("w_ih", [inp, 3 * hid])
    wh = b.weight("w_hh", [hid, 3 * hid])
    bx = b.weight("b_ih", [3 * hid])
    bh = b.weight("b_hh", [3 * hid])
    h = "h0"
    for t in range(steps):
        xt = b.op("Squeeze", [b.op("Slice", ["seq", b.const(f"s{t}", np.array([t], np.int64)), b.const(f"e{t}", np.array([t + 1], np.int64)), b.const(f"a{t}", np.array([0], np.int64))]), b.const(f"sq{t}", np.array([0], np.int64))])
        gx = b.op("Add", [b.op("MatMul", [xt, wx]), bx])
        gh = b.op("Add", [b.op("MatMul", [h, wh]), bh])
        rx, zx, nx = b.op("Split", [gx], n_out=3, axis=1)
        rh, zh, nh = b.op("Split", [gh], n_out=3, axis=1)
        r = b.op("Sigmoid", [b.op("Add", [rx, rh])])
        z = b.op("Sigmoid", [b.op("Add", [zx, zh])])
        n = b.op("Tanh", [b.op("Add", [nx, b.op("Mul", [r, nh])])])
        # h = (1 - z) * n + z * h
        h = b.op("Add", [b.op("Mul", [b.op("Sub", [b.const(f"one{t}", np.array(1.0, np.float32)), z]), n]), b.op("Mul", [z, h])])
    rng = np.random.default_rng(14)
    feeds = {
        "seq": rng.standard_normal((steps, batch, inp)).astype(np.float32),
        "h0": rng.standard_normal((batch, hid)).astype(np.float32),
    }
    b.save("gru", ["seq", "h0"], h, [batch, hid], feeds)


def recurrent():
    """A bidirectional LSTM feeding a GRU (the RNN ops PyTorch exports for
    nn.LSTM / nn.GRU), then a linear layer on the GRU's last state."""
    b = Builder(15)
    steps, batch, inp, hid = 12, 2, 8, 16
    w = b.weight("lstm_w", [2, 4 * hid, inp])
    r = b.weight("lstm_r", [2, 4 * hid, hid])
    bias = b.weight("lstm_b", [2, 8 * hid], 0.1)
    y, _, _ = b.op("LSTM", ["seq", w, r, bias, "", "h0", "c0"], n_out=3,
                   direction="bidirectional", hidden_size=hid)
    # [steps, 2, batch, hid] -> [steps, batch, 2 * hid]
    y = b.op("Reshape", [b.op("Transpose", [y], perm=[0, 2, 1, 3]), b.const("ys", np.array([steps, batch, 2 * hid], np.int64))])
    gw = b.weight("gru_w", [1, 3 * hid, 2 * hid])
    gr = b.weight("gru_r", [1, 3 * hid, hid])
    gb = b.weight("gru_b", [1, 6 * hid], 0.1)
    _, h = b.op("GRU", [y, gw, gr, gb], n_out=2, hidden_size=hid, linear_before_reset=1)
    h = b.op("Reshape", [h, b.const("hs", np.array([batch, hid], np.int64))])
    out = b.op("Gemm", [h, b.weight("fc_w", [4, hid]), b.weight("fc_b", [4], 0.1)], transB=1)
    rng = np.random.default_rng(16)
    feeds = {
        "seq": rng.standard_normal((steps, batch, inp)).astype(np.float32),
        "h0": rng.standard_normal((2, batch, hid)).astype(np.float32),
        "c0": rng.standard_normal((2, batch, hid)).astype(np.float32),
    }
    b.save("recurrent", ["seq", "h0", "c0"], out, [batch, 4], feeds)


if __name__ == "__main__":
    for f in [mlp, cnn, transformer, gru, recurrent]:
        f()
    sys.exit(0)
