#!/usr/bin/env python3
"""Runs ONNX's backend node tests through dlc and writes a table.

Each node test of the `onnx` package (one tiny model and reference
inputs/outputs per operator case) is saved as model.onnx plus .npy inputs,
run with `dlc run --backend cpu`, and its outputs compared with the
reference at the test's own tolerances (numpy.testing.assert_allclose with
the case's rtol/atol, as ONNX's backend runner does). Each test is one of:

  passed       every output matches
  failed       dlc ran but an output differs (shape or numbers), or dlc
               rejected the imported program (an importer bug)
  unsupported  dlc refused the model with a clear error (an op, attribute
               or element type it does not support)
  crashed      dlc died (a signal, a panic, an internal error) or hung

A test whose shapes are not static (an input that sets a shape, axes or
bounds, which dlc must know when compiling; or a tensor with no elements) is
marked dynamic: the summary also gives the pass rate of the static ones.
When dlc says an input must be a constant, the test is run again with its
small inputs (integer vectors, scalars, scales/sizes/roi) bound to the
test's values (`dlc run --bind NAME=PATH`): the model specialized to them,
as a static-shape compiler takes it. Such passes are counted apart.

Usage: onnx_node_tests.py DLC OUT_DIR [--filter SUBSTRING] [--jobs N]
Writes OUT_DIR/results.md and OUT_DIR/results.json and prints the summary.
"""

import argparse
import collections
import concurrent.futures
import json
import os
import re
import subprocess
import sys
import tempfile
import warnings

import numpy as np
import onnx
from onnx import numpy_helper
from onnx.backend.test.case import node as node_cases

TIMEOUT_S = 120
NPY_TYPES = {
    np.float16, np.float32, np.float64,
    np.int8, np.int16, np.int32, np.int64,
    np.uint8, np.uint16, np.uint32, np.uint64,
    np.bool_,
}


def is_unsupported(message):
    return bool(
        re.search(
            r"not supported|does not support|is not defined on|"
            r"needs a float input|must be a constant|dlc shapes are static|"
            r"has no elements|positive extents",
            message,
        )
    )


def as_array(value):
    """A test's tensor as a NumPy array, or None for a sequence or map."""
    if isinstance(value, onnx.TensorProto):
        return numpy_helper.to_array(value)
    if isinstance(value, (np.ndarray, np.generic)):
        return np.asarray(value)
    return None


SHAPE_INPUTS = {"scales", "sizes", "roi"}


def bindable(name, value):
    value = np.asarray(value)
    return value.ndim == 0 or (
        value.ndim == 1
        and (np.issubdtype(value.dtype, np.integer) or name in SHAPE_INPUTS)
    )


def run_case(dlc, case, workdir, bind=False):
    """Returns (status, message) for one test case."""
    model = case.model
    path = os.path.join(workdir, "model.onnx")
    with open(path, "wb") as f:
        f.write(model.SerializeToString())
    graph_inputs = [i.name for i in model.graph.input]
    for k, (inputs, outputs) in enumerate(case.data_sets):
        args = [dlc, "run", path, "--backend", "cpu"]
        for name, value in zip(graph_inputs, inputs):
            value = as_array(value)
            if value is None:
                return "unsupported", "an input is not a tensor (sequence, map or optional)"
            if value.dtype.name == "bfloat16":
                # NumPy has no bfloat16: dlc reads a bf16 input from float32.
                value = value.astype(np.float32)
            if value.dtype.type not in NPY_TYPES:
                return "unsupported", f"input `{name}` has element type {value.dtype}"
            file = os.path.join(workdir, f"in{len(args)}.npy")
            np.save(file, np.array(value, order="C"))
            flag = "--bind" if bind and bindable(name, value) else "--input"
            args += [flag, f"{name}={file}"]
        outdir = os.path.join(workdir, f"out{k}")
        os.makedirs(outdir, exist_ok=True)
        args += ["--save-outputs", outdir]
        try:
            p = subprocess.run(args, capture_output=True, text=True, timeout=TIMEOUT_S)
        except subprocess.TimeoutExpired:
            return "crashed", f"no result within {TIMEOUT_S} s"
        err = p.stderr.strip()
        first = err.splitlines()[0] if err else ""
        if p.returncode < 0 or "panicked" in err or "internal compiler error" in err:
            return "crashed", first or f"killed by signal {-p.returncode}"
        if p.returncode != 0:
            if is_unsupported(err):
                return "unsupported", first
            return "failed", first
        # The files dlc wrote, in output order (named after the outputs).
        written = [line[len("wrote "):] for line in p.stdout.splitlines()
                   if line.startswith("wrote ")]
        for j, want in enumerate(outputs):
            want = as_array(want)
            if want is None:
                return "unsupported", f"output {j} is not a tensor"
            if j >= len(written) or not os.path.exists(written[j]):
                return "failed", f"output {j} was not written"
            file = written[j]
            got = np.load(file)
            if want.dtype.name == "bfloat16":
                want = want.astype(np.float32)  # dlc writes bf16 results as float32
            if got.shape != want.shape:
                return "failed", f"output {j}: shape {got.shape}, reference {want.shape}"
            if got.dtype != want.dtype:
                return "failed", f"output {j}: element type {got.dtype}, reference {want.dtype}"
            try:
                if want.dtype == np.bool_ or np.issubdtype(want.dtype, np.integer):
                    np.testing.assert_array_equal(got, want)
                else:
                    np.testing.assert_allclose(
                        got.astype(np.float64),
                        want.astype(np.float64),
                        rtol=case.rtol,
                        atol=case.atol,
                    )
            except AssertionError as e:
                lines = [l for l in str(e).splitlines() if l.strip()]
                return "failed", f"output {j}: " + " ".join(lines[1:4])
    return "passed", ""


def is_dynamic(message):
    return bool(re.search(r"dlc shapes are static|positive extents", message))


def op_of(case):
    ops = sorted({n.op_type for n in case.model.graph.node})
    if len(ops) == 1:
        return ops[0]
    return "expanded" if case.name.endswith("_expanded") else "+".join(ops)[:40]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("dlc")
    ap.add_argument("out")
    ap.add_argument("--filter", default="")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 2)
    args = ap.parse_args()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cases = [c for c in node_cases.collect_testcases(None) if args.filter in c.name]
    os.makedirs(args.out, exist_ok=True)
    dlc = os.path.abspath(args.dlc)

    def one(case):
        with tempfile.TemporaryDirectory() as d:
            bound = False
            try:
                status, msg = run_case(dlc, case, d)
                if status == "unsupported" and "dlc shapes are static" in msg:
                    again = run_case(dlc, case, d, bind=True)
                    if again[0] != "unsupported" or "dlc shapes are static" not in again[1]:
                        (status, msg), bound = again, True
            except Exception as e:  # the adapter's own failure, not dlc's
                status, msg = "failed", f"adapter: {e}"
        return case, status, msg, bound

    results = []
    with concurrent.futures.ThreadPoolExecutor(args.jobs) as pool:
        for case, status, msg, bound in pool.map(one, cases):
            results.append(
                {
                    "test": case.name,
                    "op": op_of(case),
                    "status": status,
                    "message": msg,
                    "bound": bound,
                    "dynamic": bound or (status == "unsupported" and is_dynamic(msg)),
                }
            )
    results.sort(key=lambda r: r["test"])
    statuses = ["passed", "failed", "unsupported", "crashed"]
    total = collections.Counter(r["status"] for r in results)
    per_op = collections.defaultdict(collections.Counter)
    for r in results:
        per_op[r["op"]][r["status"]] += 1
    n = len(results)
    static = [r for r in results if not r["dynamic"]]
    static_passed = sum(r["status"] == "passed" for r in static)
    bound_passed = sum(r["status"] == "passed" and r["bound"] for r in results)
    lines = [
        "# ONNX backend node tests through dlc",
        "",
        f"onnx {onnx.__version__}; `dlc run --backend cpu`; {n} tests.",
        "",
        "| | " + " | ".join(statuses) + " |",
        "|---|" + "---|" * len(statuses),
        "| all | " + " | ".join(f"{total[s]} ({100 * total[s] / max(n, 1):.1f}%)" for s in statuses) + " |",
        "",
        f"Static shapes: {len(static)} tests ({n - len(static)} set a shape from an input or hold an "
        f"empty tensor); {static_passed} passed ({100 * static_passed / max(len(static), 1):.1f}%). "
        f"Of the others, {bound_passed} passed with their shape inputs bound to the test's values.",
        "",
        "## Per operator",
        "",
        "| op | " + " | ".join(statuses) + " |",
        "|---|" + "---|" * len(statuses),
    ]
    for op in sorted(per_op):
        lines.append(f"| {op} | " + " | ".join(str(per_op[op][s]) for s in statuses) + " |")
    lines += ["", "## Tests not passed", "", "| test | status | message |", "|---|---|---|"]
    for r in results:
        if r["status"] != "passed":
            msg = r["message"].replace("|", "\\|")[:300]
            lines.append(f"| {r['test']} | {r['status']} | {msg} |")
    with open(os.path.join(args.out, "results.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    with open(os.path.join(args.out, "results.json"), "w") as f:
        json.dump(results, f, indent=1)
    print("\n".join(lines[:9]))
    print(f"wrote {os.path.join(args.out, 'results.md')}")
    return 1 if total["crashed"] else 0


if __name__ == "__main__":
    sys.exit(main())
