#!/usr/bin/env python3
"""The real-model ONNX tests (tests/onnx/) timed by `dlc bench` and by an
onnxruntime session (one thread, full graph optimization) in one run:
median latency over 500 runs after 20 warm-up runs, and compile or
session-creation time. Usage: onnx_bench.py [DLC]."""
import json, subprocess, time, sys, os
import numpy as np, onnxruntime as ort
root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "onnx")
dlc = sys.argv[1] if len(sys.argv) > 1 else "target/release/dlc"
rows = []
for name in ["mlp", "cnn", "transformer", "gru", "recurrent"]:
    d = os.path.join(root, name)
    feeds = {f[:-4]: np.load(os.path.join(d, f)) for f in sorted(os.listdir(d)) if f.endswith(".npy") and not f.startswith("out")}
    o = ort.SessionOptions(); o.intra_op_num_threads = 1; o.inter_op_num_threads = 1
    t0 = time.perf_counter()
    s = ort.InferenceSession(os.path.join(d, "model.onnx"), o, providers=["CPUExecutionProvider"])
    ort_load = time.perf_counter() - t0
    for _ in range(20): s.run(None, feeds)
    ts = []
    for _ in range(500):
        t = time.perf_counter(); s.run(None, feeds); ts.append(time.perf_counter() - t)
    ort_ms = float(np.median(ts)) * 1e3
    out = subprocess.run([dlc, "bench", os.path.join(d, "model.onnx"), "--runs", "500", "--warmup", "20", "--json"], capture_output=True, text=True)
    j = json.loads(out.stdout)
    rows.append((name, j["median_ms"], ort_ms, j["compile_s"], ort_load))
print("| model | dlc median ms | onnxruntime median ms | dlc/ort | dlc compile s | ort session s |")
print("|---|---|---|---|---|---|")
for n, a, b, c, l in rows:
    print(f"| {n} | {a:.4f} | {b:.4f} | {a/b:.2f} | {c:.3f} | {l:.3f} |")
