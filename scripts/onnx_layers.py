#!/usr/bin/env python3
"""make onnx-layers: one exported network's layers, each on its own, dlc
against onnxruntime.

Each Conv, Gemm and MatMul node of the model, with the elementwise epilogue
it alone feeds (Clip, Relu, Add of another tensor, HardSwish, HardSigmoid,
Sigmoid), is cut out with `onnx.utils.extract_model` into a model of its
own, compiled by `dlc compile --emit so`, and called alternately with an
onnxruntime session of the same model (one thread each, random inputs from
seed 0) as `onnx_bench.py` alternates whole models (`interleaved`: blocks of
ten calls, the first two not counted); the 25th percentiles of each and the
error against onnxruntime are printed, with their sums. A layer's inputs,
weights and output stay in the caches between the calls of a block, as they
do not in the whole model: `--evict MB` writes that much other memory
before every call, for the other extreme.
onnxruntime's single-node sessions also reorder to and from its blocked
layout, so its side of each row carries more than the node's work; what the
rows compare reliably is dlc's layers with each other and with dlc's whole
model (`make onnx-bench`).

The model is one `scripts/onnx_bench.py` exports (exported here first if it
is not there yet). Writes target/onnx-bench/NAME/layers.md. Usage:
onnx_layers.py [DLC] --model NAME [--rounds N] [--evict MB].
"""

import argparse
import os
import subprocess
import sys

import numpy as np
import onnx
import onnxruntime as ort
from onnx import shape_inference, utils

from onnx_bench import exported, interleaved

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
PRODUCTS = ("Conv", "Gemm", "MatMul")
EPILOGUES = ("Clip", "Relu", "Add", "HardSwish", "HardSigmoid", "Sigmoid")


def layers(model):
    """(node index, node, inputs, output) of each product with the
    epilogue only it feeds: the inputs are the product's first and any
    other tensor an `Add` brings that is not an initializer."""
    consumers = {}
    for n in model.graph.node:
        for i in n.input:
            consumers.setdefault(i, []).append(n)
    initializers = {i.name for i in model.graph.initializer}
    for k, n in enumerate(model.graph.node):
        if n.op_type not in PRODUCTS:
            continue
        inputs = [i for i in n.input[:2] if i not in initializers][:2]
        out = n.output[0]
        while True:
            c = consumers.get(out, [])
            if len(c) != 1 or c[0].op_type not in EPILOGUES:
                break
            if c[0].op_type == "Add":
                inputs += [i for i in c[0].input if i != out and i not in initializers]
            out = c[0].output[0]
        yield k, n, inputs, out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("dlc", nargs="?", default=os.path.join(ROOT, "target", "release", "dlc"))
    ap.add_argument("--model", required=True, help="a model scripts/onnx_bench.py exports")
    ap.add_argument("--rounds", type=int, default=20, help="alternated blocks per layer")
    ap.add_argument("--evict", type=int, default=0,
                    help="MB of other memory written before every call")
    a = ap.parse_args()
    path, _ = exported(a.model)
    d = os.path.dirname(path)
    work = os.path.join(d, "layers")
    os.makedirs(work, exist_ok=True)
    model = shape_inference.infer_shapes(onnx.load(path))
    known = list(model.graph.value_info) + list(model.graph.input) + list(model.graph.output)
    shapes = {v.name: [x.dim_value for x in v.type.tensor_type.shape.dim] for v in known}
    other = np.ones(a.evict << 18, np.float32)

    def evict():
        np.add(other, 1.0, out=other)
    rng = np.random.default_rng(0)
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    rows, sums = [], [0.0, 0.0]
    for k, node, inputs, out in layers(model):
        if any(not shapes.get(i) or 0 in shapes[i] for i in inputs + [out]):
            rows.append(f"| {node.name} | {node.op_type} | shapes not static: not measured |")
            continue
        stem = f"layer_{k}"
        cut = os.path.join(work, f"{stem}.onnx")
        utils.extract_model(path, cut, inputs, [out])
        m = onnx.load(cut)
        m.graph.name = "main_graph"
        onnx.save(m, cut)
        lib = os.path.join(work, f"{stem}.so")
        r = subprocess.run([a.dlc, "compile", cut, "--emit", "so", "-o", lib],
                           capture_output=True, text=True)
        if r.returncode != 0:
            rows.append(f"| {node.name} | dlc compile failed: "
                        f"{r.stderr.strip().splitlines()[-1][:200]} |")
            continue
        session = ort.InferenceSession(cut, options, providers=["CPUExecutionProvider"])
        feeds = {i: rng.standard_normal(shapes[i]).astype(np.float32) for i in inputs}
        want = session.run(None, feeds)[0]
        dlc_ms, ort_ms, outs = interleaved(lib, session, feeds, a.rounds,
                                           f"dlc_{stem}_main_graph", evict if a.evict else None)
        error = float(np.max(np.abs(outs[0] - want))) / (float(np.max(np.abs(want))) or 1.0)
        sums[0] += dlc_ms
        sums[1] += ort_ms
        rows.append(f"| {node.name} | {node.op_type} "
                    f"| {shapes.get(inputs[0])} -> {shapes.get(out)} | {dlc_ms:.4f} "
                    f"| {ort_ms:.4f} | {dlc_ms / ort_ms:.2f} | {error:.1e} |")
        print(rows[-1], flush=True)
    lines = [
        f"{a.model}: each product with its epilogue as a model of its own, dlc's library and "
        f"onnxruntime alternated at one thread ({max(3, a.rounds)} blocks of ten calls, the "
        f"first two not counted; 25th percentiles in ms"
        + (f"; {a.evict} MB of other memory written before every call" if a.evict else "")
        + "). onnxruntime's single-node sessions reorder to and from their blocked layout too.",
        "",
        "| node | op | input -> output | dlc | ort | ratio | error vs ort |",
        "|---|---|---|---|---|---|---|",
        *rows,
        f"| sum | | | {sums[0]:.3f} | {sums[1]:.3f} | "
        f"{sums[0] / sums[1] if sums[1] else float('nan'):.2f} | |",
    ]
    text = "\n".join(lines) + "\n"
    with open(os.path.join(d, "layers.md"), "w") as out_file:
        out_file.write(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
