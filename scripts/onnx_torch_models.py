#!/usr/bin/env python3
"""Builds the real-model ONNX tests that PyTorch's exporters write.

scripts/onnx_models.py writes models node by node with onnx.helper; the
models users bring are exported from torch.nn, and the exporters write
things no hand-built model has: the shape arithmetic of
nn.MultiheadAttention's reshapes (an empty slice of a shape tensor,
concatenated), and, from the torch.export-based exporter that is PyTorch's
default since 2.9, weights kept as external data beside the model.

Each directory under tests/onnx/ holds model.onnx (and model.onnx.data when
the weights are external), its inputs as NAME.npy and onnxruntime's outputs
as out0.npy, as scripts/onnx_models.py writes them; tools/dlc/tests/onnx.rs
runs them through dlc. Rerun with `make onnx-torch-models` after changing a
model (its output depends on the pinned PyTorch and onnx versions).
"""

import os
import sys

import numpy as np
import onnx
import onnxruntime as ort
import torch
from torch import nn

OPSET = 17
ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "onnx")


class Encoder(nn.Module):
    """Token embedding, a two-layer nn.TransformerEncoder, a linear head."""

    def __init__(self, vocab=50, d=32, heads=4, layers=2):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        layer = nn.TransformerEncoderLayer(d, heads, 2 * d, dropout=0.0, batch_first=True)
        self.enc = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = nn.Linear(d, vocab)

    def forward(self, ids):
        return self.head(self.enc(self.emb(ids)))


def save(name, model_path, feeds):
    """onnxruntime's outputs for `feeds` and the inputs, beside the model."""
    d = os.path.dirname(model_path)
    for n, v in feeds.items():
        np.save(os.path.join(d, f"{n}.npy"), v)
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(model_path, opts, providers=["CPUExecutionProvider"])
    for i, out in enumerate(sess.run(None, feeds)):
        np.save(os.path.join(d, f"out{i}.npy"), out)
    print(f"wrote {d}")


def encoder():
    torch.manual_seed(0)
    m = Encoder().eval()
    ids = torch.randint(0, 50, (2, 8))
    feeds = {"ids": ids.numpy()}

    # The TorchScript exporter: nn.MultiheadAttention's reshape arithmetic.
    d = os.path.join(ROOT, "torch_encoder")
    os.makedirs(d, exist_ok=True)
    path = os.path.join(d, "model.onnx")
    torch.onnx.export(m, (ids,), path, opset_version=OPSET, dynamo=False,
                      input_names=["ids"], output_names=["logits"])
    save("torch_encoder", path, feeds)

    # The torch.export-based exporter (the default), weights external.
    d = os.path.join(ROOT, "torch_encoder_external")
    os.makedirs(d, exist_ok=True)
    path = os.path.join(d, "model.onnx")
    program = torch.onnx.export(m, (ids,), dynamo=True, opset_version=OPSET,
                                input_names=["ids"], output_names=["logits"])
    model = program.model_proto
    for f in os.listdir(d):
        os.remove(os.path.join(d, f))
    onnx.save(model, path, save_as_external_data=True, all_tensors_to_one_file=True,
              location="model.onnx.data")
    save("torch_encoder_external", path, feeds)


if __name__ == "__main__":
    encoder()
    sys.exit(0)
