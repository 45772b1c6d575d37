#!/usr/bin/env python3
"""make onnx-profile: one exported network's time node by node, in the whole
model, dlc against onnxruntime.

Each round runs `dlc bench MODEL --profile --json` (every kernel launch timed
in the compiled code, the median of the runs) and then an onnxruntime session
with its own profiler (`enable_profiling`, the median of the same number of
runs), on the same threads (one unless `--threads`), alternating so that a
burst of another process lands on both. Both sides are grouped by the model's node each kernel or onnxruntime
node computes, after fusion: a chain of elementwise nodes (Clip, Relu, Add of
a residual, ...) goes to the product (Conv, Gemm, MatMul) it follows, as both
fuse such chains into the product, and onnxruntime's blocked-layout nodes
(named after the tensor they write, `..._nchwc`) to the node that writes it,
and a node onnxruntime fused (`/l/MatMul/MatMulAddFusion`) to the first node
whose name its own begins with.
Per node: the median over the rounds of each side's time, their difference,
and the least and greatest of the rounds' ratios; nodes only onnxruntime has
(its layout reorders) are summed at the end.

Unlike `make onnx-layers`, every node here runs where the model runs it,
after the nodes before it, with its inputs and weights wherever the caches
left them. The model is one `scripts/onnx_bench.py` exports (exported here
first if it is not there yet). Writes target/onnx-bench/NAME/profile.md.
Usage: onnx_profile.py [DLC] --model NAME [--rounds N] [--runs N] [--threads N].
"""

import argparse
import collections
import json
import os
import re
import subprocess

import numpy as np
import onnx
import onnxruntime as ort

from onnx_bench import exported

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
PRODUCTS = ("Conv", "Gemm", "MatMul")
EPILOGUES = ("Clip", "Relu", "Add", "HardSwish", "HardSigmoid", "Sigmoid", "Mul")


def anchors(model):
    """A function from a node or tensor name to the node it is grouped
    under: a product for the elementwise chain after it, else itself."""
    nodes = {n.name: n for n in model.graph.node}
    producer = {o: n for n in model.graph.node for o in n.output}
    consumers = collections.defaultdict(list)
    for n in model.graph.node:
        for i in n.input:
            consumers[i].append(n)

    def up(n, seen=0):
        if n.op_type in PRODUCTS or n.op_type not in EPILOGUES or seen > 8:
            return n
        for i in n.input:
            p = producer.get(i)
            # Every reader elementwise (a SiLU's Sigmoid and Mul both read
            # the convolution's output): the chain fuses into the product.
            if p is not None and all(c.op_type in EPILOGUES for c in consumers[i]):
                a = up(p, seen + 1)
                if a.op_type in PRODUCTS:
                    return a
        return n

    def anchor(name):
        n = nodes.get(name)
        if n is None:
            n = producer.get(re.sub(r"_nchwc$", "", name))
        # A node onnxruntime fused is named after the first node it took
        # with the fusion's names appended ("/l/MatMul/MatMulAddFusion",
        # "/l/MatMul_1/MatMulScaleFusion//MatmulTransposeFusion/").
        probe = name
        while n is None and "/" in probe:
            probe = probe.rsplit("/", 1)[0]
            n = nodes.get(probe)
        return (up(n).name, up(n).op_type) if n is not None else (name, "")
    return anchor


def dlc_round(dlc, path, runs, threads, anchor):
    out = subprocess.run([dlc, "bench", path, "--profile", "--runs", str(runs),
                          "--threads", str(threads), "--json"],
                         capture_output=True, text=True, check=True).stdout
    report = json.loads(out)
    times = collections.defaultdict(float)
    for launch in report["profile"]:
        m = re.search(r"node `([^`]*)`", launch["place"])
        times[anchor(m.group(1)) if m else (launch["place"] or "no place", "")] += \
            launch["median_ms"]
    return report["median_ms"], times, report.get("core_round_trip_ns")


def ort_round(path, feeds, runs, threads, anchor, prefix):
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.enable_profiling = True
    options.profile_file_prefix = prefix
    session = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
    warmup = 3
    for _ in range(warmup + runs):
        session.run(None, feeds)
    profile = session.end_profiling()
    with open(profile) as f:
        events = json.load(f)
    os.remove(profile)
    per = collections.defaultdict(list)
    for e in events:
        if e.get("cat") == "Node" and e["name"].endswith("_kernel_time"):
            per[e["name"][:-len("_kernel_time")]].append(e["dur"] / 1e3)
    times = collections.defaultdict(float)
    for name, ms in per.items():
        times[anchor(name)] += float(np.median(ms[warmup:] or ms))
    return sum(times.values()), times


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("dlc", nargs="?", default=os.path.join(ROOT, "target", "release", "dlc"))
    ap.add_argument("--model", required=True, help="a model scripts/onnx_bench.py exports")
    ap.add_argument("--rounds", type=int, default=4, help="alternated rounds")
    ap.add_argument("--runs", type=int, default=100, help="calls a round on each side")
    ap.add_argument("--threads", type=int, default=1, help="threads of both sides")
    a = ap.parse_args()
    path, inputs = exported(a.model)
    d = os.path.dirname(path)
    anchor = anchors(onnx.load(path, load_external_data=False))
    feeds = {name: np.load(saved) for name, saved in inputs.items()}
    dlc_t, ort_t = collections.defaultdict(list), collections.defaultdict(list)
    totals = []
    for r in range(a.rounds):
        dlc_total, dt, round_trip = dlc_round(a.dlc, path, a.runs, a.threads, anchor)
        ort_total, ot = ort_round(path, feeds, a.runs, a.threads, anchor, os.path.join(d, "ort-profile"))
        totals.append((dlc_total, ort_total))
        for k, v in dt.items():
            dlc_t[k].append(v)
        for k, v in ot.items():
            ort_t[k].append(v)
        cores = "" if round_trip is None else \
            f"; a cache line between dlc's two threads and back {round_trip:.0f} ns"
        print(f"round {r + 1}: dlc {dlc_total:.3f} ms (median call), "
              f"onnxruntime {ort_total:.3f} ms (its nodes' medians){cores}", flush=True)
    rows = []
    for k, ds in dlc_t.items():
        os_ = ort_t.get(k, [])
        dm = float(np.median(ds))
        om = float(np.median(os_)) if os_ else float("nan")
        ratios = [x / y for x, y in zip(ds, os_) if y > 0]
        rows.append((dm - om if os_ else dm, k, dm, om, ratios))
    rows.sort(key=lambda r: -r[0])
    only_ort = sum(float(np.median(v)) for k, v in ort_t.items() if k not in dlc_t)
    lines = [
        f"{a.model}: time in each node of the whole model, {a.threads} thread(s), {a.rounds} rounds of "
        f"{a.runs} calls alternating `dlc bench --profile` and onnxruntime's profiler; "
        "per node the median over the rounds of each side's median, in ms, and the range "
        "of the rounds' ratios. A product's row holds the elementwise nodes fused into it.",
        "",
        "| node | op | dlc | ort | dlc - ort | ratio (rounds) |",
        "|---|---|---|---|---|---|",
    ]
    for diff, (name, op), dm, om, ratios in rows:
        spread = f"{min(ratios):.2f}-{max(ratios):.2f}" if ratios else "-"
        lines.append(f"| {name} | {op} | {dm:.3f} | {om:.3f} | {diff:+.3f} | {spread} |")
    dsum = sum(r[2] for r in rows)
    osum = sum(r[3] for r in rows if r[3] == r[3])
    lines += [
        f"| sum of the nodes both run | | {dsum:.3f} | {osum:.3f} | {dsum - osum:+.3f} | |",
        f"| onnxruntime's own nodes (layout reorders) | | | {only_ort:.3f} | | |",
        "",
        "Whole calls, each round (dlc's median call; onnxruntime's nodes summed): "
        + ", ".join(f"{x:.2f} / {y:.2f}" for x, y in totals) + ".",
    ]
    text = "\n".join(lines) + "\n"
    with open(os.path.join(d, "profile.md"), "w") as out_file:
        out_file.write(text)
    print(text)


if __name__ == "__main__":
    main()
