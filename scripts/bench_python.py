"""make bench-python: what the Python package costs and what the torch.compile
backend gives, measured in one run on this machine.

1. Per-call overhead: a small model called through `Module.__call__` (NumPy in
   and out), `Module.tensors` (DLPack out) and a bound module, against the same
   compiled function called directly through its C ABI (ctypes on the shared
   library `Module.save` writes: the C call plus ctypes' own cost, an upper
   bound of the direct call).
2. torch.compile: the models of python/tests/models.py on eager PyTorch,
   Inductor (`torch.compile` default) and dlc (`backend="dlc"`), at 1 and 2
   threads, each compiled result checked against eager before its time counts;
   medians with the spread (min-max) of the timed runs, and compile times (the
   first call less a steady one).

Writes target/bench/python.md and python.json.
"""

import argparse
import ctypes
import json
import os
import platform
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np
import torch
import torch._inductor.config

import dlc
import dlc.dynamo

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "python" / "tests"))
from models import MODELS, randomize_batchnorm  # noqa: E402

SMALL = "fn small(x: f32[16], y: f32[16]) -> f32[16] { return relu(x * y + 1.0); }"


def per_call(f, calls, repeats):
    """Median, min and max over `repeats` of the mean time of `calls` calls, in microseconds."""
    f()
    samples = []
    for _ in range(repeats):
        t = time.perf_counter()
        for _ in range(calls):
            f()
        samples.append((time.perf_counter() - t) / calls * 1e6)
    return statistics.median(samples), min(samples), max(samples)


def overhead(calls, repeats):
    m = dlc.compile(SMALL)
    x = np.random.rand(16).astype(np.float32)
    y = np.random.rand(16).astype(np.float32)
    bound = m.bind({"y": y})
    rows = {}
    with tempfile.TemporaryDirectory() as d:
        m.save(Path(d) / "small")
        (lib,) = [p for p in (Path(d) / "small").iterdir() if p.suffix == ".so"]
        so = ctypes.CDLL(str(lib))
        fn = so.dlc_small
        fn.restype = ctypes.c_int32
        fn.argtypes = [ctypes.c_void_p] * 3
        out = np.zeros(16, np.float32)
        px, py, po = x.ctypes.data, y.ctypes.data, out.ctypes.data
        rows["C ABI (ctypes, direct)"] = per_call(lambda: fn(px, py, po), calls, repeats)
        np.testing.assert_allclose(out, np.maximum(x * y + 1, 0), rtol=1e-6)
    rows["Module.__call__ (NumPy in and out)"] = per_call(lambda: m(x, y), calls, repeats)
    rows["Module.tensors (DLPack out)"] = per_call(lambda: m.tensors(x, y), calls, repeats)
    rows["bound module (one input)"] = per_call(lambda: bound(x), calls, repeats)
    rows["Module.__call__ by name"] = per_call(lambda: m(x=x, y=y), calls, repeats)
    return rows


def steady(f, runs, warmup):
    for _ in range(warmup):
        f()
    samples = []
    for _ in range(runs):
        t = time.perf_counter()
        f()
        samples.append((time.perf_counter() - t) * 1e3)
    return statistics.median(samples), min(samples), max(samples)


def models(names, runs, warmup, threads):
    """Each model on eager, Inductor and dlc. Compiles are cold: Inductor's
    caches are off and dlc's object cache is a fresh directory."""
    torch._inductor.config.force_disable_caches = True
    cache = tempfile.TemporaryDirectory()
    os.environ["DLC_CACHE_DIR"] = cache.name
    results = {}
    for name in names:
        model, inputs = MODELS[name]()
        model = randomize_batchnorm(model).eval()
        entry = {}
        with torch.no_grad():
            want = model(*inputs)
            compiled = {}
            for kind in ("inductor", "dlc"):
                torch._dynamo.reset()
                c = torch.compile(model, dynamic=False) if kind == "inductor" else torch.compile(model, backend="dlc", dynamic=False)
                t = time.perf_counter()
                try:
                    with warnings.catch_warnings():
                        warnings.simplefilter("ignore")
                        got = c(*inputs)
                except Exception as e:  # Inductor needs a C++ compiler; say why a row is missing
                    entry[f"{kind} failed"] = str(e).splitlines()[0][:200]
                    print(f"{name} on {kind}: {entry[f'{kind} failed']}", flush=True)
                    continue
                first = time.perf_counter() - t
                err = ((got - want).abs().max() / want.abs().max().clamp_min(1e-6)).item()
                if err > 1e-4:
                    raise SystemExit(f"{name} on {kind}: relative error {err:.2e} against eager")
                compiled[kind] = c
                entry[f"{kind} compile s"] = first
                entry[f"{kind} error"] = err
            for n in threads:
                torch.set_num_threads(n)
                dlc.set_num_threads(n)
                entry[f"eager {n}t"] = steady(lambda: model(*inputs), runs, warmup)
                for kind, c in compiled.items():
                    entry[f"{kind} {n}t"] = steady(lambda: c(*inputs), runs, warmup)
            for kind in compiled:
                entry[f"{kind} compile s"] -= entry[f"{kind} {threads[0]}t"][0] / 1e3
        results[name] = entry
        print(f"{name}: done", flush=True)
    return results


def fmt(t):
    return f"{t[0]:.3f} ({t[1]:.3f}-{t[2]:.3f})"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out", type=Path)
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--only", default=None, help="comma-separated model names")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    cpu = platform.processor() or "unknown"
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    names = args.only.split(",") if args.only else sorted(MODELS)
    threads = [1, 2]
    over = overhead(calls=2000, repeats=15)
    res = models(names, args.runs, warmup=3, threads=threads)
    lines = [
        "# dlc from Python",
        "",
        f"CPU: {cpu}; torch {torch.__version__}; `make bench-python` (RUNS={args.runs}).",
        "",
        "## Per-call overhead (a 16-element model; microseconds per call, median (min-max) of 15 x 2000 calls)",
        "",
        "| call | us |",
        "|---|---|",
    ]
    for k, v in over.items():
        lines.append(f"| {k} | {fmt(v)} |")
    base = over["C ABI (ctypes, direct)"][0]
    lines += ["", f"Overhead of `Module.__call__` over the direct call: {over['Module.__call__ (NumPy in and out)'][0] - base:.2f} us.", ""]
    lines += [
        "## torch.compile (milliseconds per call, median (min-max); compile: seconds of the first call beyond a steady one, caches off)",
        "",
        "| model | threads | eager | inductor | dlc | dlc / best | compile inductor | compile dlc |",
        "|---|---|---|---|---|---|---|---|",
    ]
    def cell(e, key):
        return fmt(e[key]) if key in e else "failed"

    def seconds(e, kind):
        key = f"{kind} compile s"
        return f"{e[key]:.2f}" if key in e else e.get(f"{kind} failed", "-")

    for name, e in res.items():
        for n in threads:
            peers = [e[k][0] for k in (f"eager {n}t", f"inductor {n}t") if k in e]
            ratio = f"{e[f'dlc {n}t'][0] / min(peers):.2f}" if f"dlc {n}t" in e else "-"
            lines.append(
                f"| {name} | {n} | {cell(e, f'eager {n}t')} | {cell(e, f'inductor {n}t')} | {cell(e, f'dlc {n}t')} | "
                f"{ratio} | {seconds(e, 'inductor')} | {seconds(e, 'dlc')} |"
            )
    text = "\n".join(lines) + "\n"
    (args.out / "python.md").write_text(text)
    (args.out / "python.json").write_text(json.dumps({"cpu": cpu, "overhead_us": over, "models": res}, indent=1))
    print(text)


if __name__ == "__main__":
    main()
