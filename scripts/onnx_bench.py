#!/usr/bin/env python3
"""make onnx-bench: the networks people export, run by dlc and onnxruntime in
one run on this machine.

The models are made here, with random weights, from torch.nn and torchvision
and exported by PyTorch's TorchScript exporter (opset 17; nothing is
downloaded): ResNet-18 and -50, MobileNetV2 and V3-small, EfficientNet-B0,
ResNeXt-50 32x4d and RegNetY-400MF (grouped convolutions), a
BERT-base-sized encoder (30522-word embedding, 12 layers, d = 768, 128 tokens)
and a GPT-2-small-sized decoder block (pre-norm, causal, d = 768, 128
tokens), beside the real-model tests under tests/onnx/. For each:

- cold run: `dlc run MODEL --no-cache` on the inputs (import, compile, one
  call), its wall time and peak resident memory;
- warm run: a second `dlc run` through a fresh cache (the program from it,
  the model not imported, its weights read from the mapped file), its wall
  time and peak memory; its output must be the cold run's to the bit;
- error: the largest difference of dlc's output from onnxruntime's (one
  thread, every optimization), over the largest magnitude of onnxruntime's;
- latency at 1 and 2 threads: `dlc bench --threads N --json` and an
  onnxruntime session with N intra-op threads, medians over the same number
  of calls (as many as fit in about two seconds, 10 to 500), with the spread
  ((max - min) / median) of each;
- alternated at 1 and 2 threads: the model compiled by `dlc compile --emit
  so`, loaded with ctypes, and the onnxruntime session called alternately in
  one process (the library's OpenMP runtime and the session both at that
  many threads), in blocks of ten (the first two not counted), 25th
  percentiles: both see the same minutes of the machine, which separate runs
  do not.

Writes target/onnx-bench/results.md and results.json. Usage:
onnx_bench.py [DLC] [--only NAME,...].
"""

import argparse
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import time

# The driver process stays small (no NumPy, onnxruntime or PyTorch in it):
# a child's peak resident memory counts the memory of the process it was
# forked from, so the cold `dlc run` is started from here and everything
# heavy runs in worker processes (this script with --export or --ort).

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
OUT = os.path.join(ROOT, "target", "onnx-bench")
OPSET = 17
TESTS = ["mlp", "cnn", "transformer", "gru", "recurrent", "torch_encoder"]
EXPORTED = ["resnet18", "resnet50", "mobilenet_v2", "mobilenet_v3_small", "efficientnet_b0",
            "resnext50_32x4d", "regnet_y_400mf",
            "bert_base_encoder", "gpt2_block"]


def exported_models():
    """By name: a maker of (torch module, example inputs, input names)."""
    import torch
    import torchvision
    from torch import nn

    torch.manual_seed(0)
    image = (torch.randn(1, 3, 224, 224),)

    class Bert(nn.Module):
        def __init__(self, vocab=30522, d=768, heads=12, layers=12, seq=128):
            super().__init__()
            self.words = nn.Embedding(vocab, d)
            self.positions = nn.Parameter(torch.randn(1, seq, d) * 0.02)
            self.norm = nn.LayerNorm(d)
            layer = nn.TransformerEncoderLayer(d, heads, 4 * d, dropout=0.0, activation="gelu",
                                               batch_first=True)
            self.enc = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)

        def forward(self, ids):
            return self.enc(self.norm(self.words(ids) + self.positions))

    class Gpt2Block(nn.Module):
        def __init__(self, d=768, heads=12, seq=128):
            super().__init__()
            self.layer = nn.TransformerEncoderLayer(d, heads, 4 * d, dropout=0.0,
                                                    activation="gelu", batch_first=True,
                                                    norm_first=True)
            self.register_buffer("mask", nn.Transformer.generate_square_subsequent_mask(seq))

        def forward(self, x):
            return self.layer(x, src_mask=self.mask, is_causal=True)

    tv = torchvision.models
    return {
        "resnet18": lambda: (tv.resnet18(), image, ["image"]),
        "resnet50": lambda: (tv.resnet50(), image, ["image"]),
        "mobilenet_v2": lambda: (tv.mobilenet_v2(), image, ["image"]),
        "mobilenet_v3_small": lambda: (tv.mobilenet_v3_small(), image, ["image"]),
        "efficientnet_b0": lambda: (tv.efficientnet_b0(), image, ["image"]),
        "resnext50_32x4d": lambda: (tv.resnext50_32x4d(), image, ["image"]),
        "regnet_y_400mf": lambda: (tv.regnet_y_400mf(), image, ["image"]),
        "bert_base_encoder": lambda: (Bert(), (torch.randint(0, 30522, (1, 128)),), ["ids"]),
        "gpt2_block": lambda: (Gpt2Block(), (torch.randn(1, 128, 768),), ["x"]),
    }


def export(name):
    """Worker: the model file and its inputs as NAME.npy in
    target/onnx-bench/NAME/."""
    import numpy as np
    import torch

    module, args, input_names = exported_models()[name]()
    d = os.path.join(OUT, name)
    os.makedirs(d, exist_ok=True)
    path = os.path.join(d, "model.onnx")
    # Not under no_grad: PyTorch's fused transformer path (which the
    # TorchScript exporter cannot export) is taken only without gradients.
    module.eval()
    torch.onnx.export(module, args, path, opset_version=OPSET, dynamo=False,
                      input_names=input_names, output_names=["out"])
    for n, a in zip(input_names, args):
        np.save(os.path.join(d, f"{n}.npy"), a.numpy())


def model_files(name):
    """The model's path and its inputs' .npy files by input name."""
    d = os.path.join(ROOT, "tests", "onnx", name) if name in TESTS else os.path.join(OUT, name)
    inputs = {f[:-4]: os.path.join(d, f) for f in sorted(os.listdir(d))
              if f.endswith(".npy") and not f.startswith("out")}
    return os.path.join(d, "model.onnx"), inputs


def exported(name):
    """`model_files(name)`, exporting the model first (in a worker
    process) when it is not there yet."""
    if name not in TESTS and not os.path.exists(os.path.join(OUT, name, "model.onnx")):
        subprocess.run([sys.executable, __file__, "--export", name], check=True)
    return model_files(name)


# Seconds between two blocks of alternated calls (see `interleaved`).
BLOCK_PAUSE_S = 0.1


def interleaved(lib, session, feeds, blocks, entry="dlc_model_main_graph", before=None):
    """25th percentiles (ms) of dlc's compiled library `lib` (its function
    `entry`, taking the session's inputs in order, then its outputs) and of
    onnxruntime `session`, called alternately in this process (each at the
    thread count it was given: `OMP_NUM_THREADS`, the session's): blocks of
    ten calls each, the first two of every block not counted, so that both
    run warm and both see the machine's same minutes (this VM's medians
    drift 10-50% between runs minutes apart); at least three blocks each,
    so that one burst of another load does not decide a slow model's row
    (BERT's one block at two threads read 1.49 once, 0.93 minutes later).
    After each block the process sleeps `BLOCK_PAUSE_S`, so that the
    threads the block's runtime left spinning (onnxruntime's pool, OpenMP's
    team) are asleep before the other's block: at two threads on two cores,
    the library called right after onnxruntime ran 10-20% slower than the
    same library called second (9.22 against 7.73 ms, MobileNetV2 loaded
    twice), 13x slower with the machine busy; with the pause both read the
    same. `before`, if given, runs before every call, untimed. Also dlc's
    outputs of the last call."""
    import ctypes
    import numpy as np

    names = [i.name for i in session.get_inputs()]
    args = [np.ascontiguousarray(feeds[n]) for n in names]
    outs = [np.empty_like(np.asarray(o)) for o in session.run(None, feeds)]
    f = ctypes.CDLL(lib, mode=ctypes.RTLD_LOCAL)[entry]
    f.restype = ctypes.c_int32
    pointers = [a.ctypes.data_as(ctypes.c_void_p) for a in args + outs]

    def dlc():
        if f(*pointers) != 0:
            raise RuntimeError(f"{lib}: the compiled model failed")

    def ort():
        session.run(None, feeds)

    times = {dlc: [], ort: []}
    for _ in range(max(3, blocks)):
        for call in (dlc, ort):
            for k in range(10):
                if before is not None:
                    before()
                t = time.perf_counter()
                call()
                if k >= 2:
                    times[call].append((time.perf_counter() - t) * 1e3)
            time.sleep(BLOCK_PAUSE_S)
    p25 = {c: sorted(v)[len(v) // 4] for c, v in times.items()}
    return p25[dlc], p25[ort], outs


def entry_symbol(dlc, path):
    """The symbol of the model's entry point in what `dlc compile --emit so`
    writes: its graph's name with the default prefix (`dlc_model_main_graph`
    for PyTorch's exports, `dlc_model_mlp` for a graph named `mlp`), read
    from the C header dlc writes for the same model."""
    r = subprocess.run([dlc, "compile", path, "--emit", "header", "-o", "-"],
                       capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"dlc compile {path} --emit header: {r.stderr.strip()}")
    symbols = re.findall(r"^int32_t (\w+)\(", r.stdout, re.MULTILINE)
    if len(symbols) != 1:
        raise RuntimeError(f"{path}: expected one entry point in dlc's header, found {symbols}")
    return symbols[0]


def ort_worker(path, inputs, dlc_out, threads, lib=None, alternate=1, symbol=None):
    """Worker: onnxruntime's error against dlc's output and its latency at
    each thread count, as JSON: {"error": e, "ort1": {...}, ...}; the runs
    per thread count as many as fit in about two seconds. With `lib` (the
    model compiled by `dlc compile --emit so`), also both at `alternate`
    threads called alternately (`interleaved`; the process's
    `OMP_NUM_THREADS` must be `alternate`)."""
    import numpy as np
    import onnxruntime as ort

    def session(n):
        o = ort.SessionOptions()
        o.intra_op_num_threads = n
        o.inter_op_num_threads = 1
        return ort.InferenceSession(path, o, providers=["CPUExecutionProvider"])

    feeds = {n: np.load(p) for n, p in inputs.items()}
    ref = session(1).run(None, feeds)[0].astype(np.float64)
    got = np.load(dlc_out).astype(np.float64)
    scale = float(np.max(np.abs(ref))) or 1.0
    result = {"error": float(np.max(np.abs(got - ref))) / scale if got.shape == ref.shape
              else float("inf"), "ort_version": ort.__version__}
    for n in threads:
        s = session(n)
        t = time.perf_counter()
        s.run(None, feeds)
        first = (time.perf_counter() - t) * 1e3
        runs = int(min(500, max(10, 2000 / max(first, 1e-3))))
        warmup = max(2, runs // 20)
        for _ in range(warmup):
            s.run(None, feeds)
        ts = []
        for _ in range(runs):
            t = time.perf_counter()
            s.run(None, feeds)
            ts.append((time.perf_counter() - t) * 1e3)
        ts.sort()
        result[f"ort{n}"] = {"median_ms": ts[len(ts) // 2], "min_ms": ts[0], "max_ms": ts[-1],
                             "runs": runs, "warmup": warmup}
        if n == alternate and lib is not None:
            result[f"dlc{n}_p25"], result[f"ort{n}_p25"], _ = interleaved(lib, s, feeds,
                                                                        runs // 8, symbol)
    print(json.dumps(result))


def dlc_run(dlc, path, inputs, cache=None):
    """Wall seconds and peak resident MiB of `dlc run`, with no cache or with
    the cache in directory `cache`; its first output's file."""
    out = os.path.join(OUT, "outputs" if cache is None else "outputs-warm")
    os.makedirs(out, exist_ok=True)
    args = [dlc, "run", path, "--save-outputs", out]
    if cache is None:
        args.append("--no-cache")
    for n, p in inputs.items():
        args += ["--input", f"{n}={p}"]
    env = dict(os.environ)
    if cache is not None:
        env["DLC_CACHE_DIR"] = cache
    t = time.perf_counter()
    p = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    _, status, usage = os.wait4(p.pid, 0)
    wall = time.perf_counter() - t
    stdout, stderr = p.stdout.read(), p.stderr.read()
    if os.waitstatus_to_exitcode(status) != 0:
        raise RuntimeError(f"dlc run {path}: {stderr.strip()}")
    # The first file written holds the first output (named as the model names it).
    written = [line[len("wrote "):] for line in stdout.splitlines() if line.startswith("wrote ")]
    return wall, usage.ru_maxrss / 1024, written[0]


def warm_run(dlc, path, inputs, cold_out):
    """Wall seconds and peak resident MiB of a second `dlc run` through a
    fresh cache (the first one fills it); its output must be the cold run's,
    to the bit."""
    cache = os.path.join(OUT, "cache")
    shutil.rmtree(cache, ignore_errors=True)
    dlc_run(dlc, path, inputs, cache)
    wall, mib, out = dlc_run(dlc, path, inputs, cache)
    shutil.rmtree(cache, ignore_errors=True)
    with open(out, "rb") as a, open(cold_out, "rb") as b:
        if a.read() != b.read():
            raise RuntimeError(f"dlc run {path}: the run from the cache differs from the cold one")
    return wall, mib


def dlc_bench(dlc, path, threads, runs, warmup):
    r = subprocess.run([dlc, "bench", path, "--threads", str(threads), "--runs", str(runs),
                        "--warmup", str(warmup), "--json"], capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"dlc bench {path}: {r.stderr.strip()}")
    return json.loads(r.stdout)


def spread(t):
    return (t["max_ms"] - t["min_ms"]) / t["median_ms"]


def measure(dlc, name):
    if name not in TESTS:
        subprocess.run([sys.executable, __file__, "--export", name], check=True,
                       capture_output=True, text=True)
    path, inputs = model_files(name)
    row = {"model": name}
    row["model_mib"] = sum(os.path.getsize(os.path.join(os.path.dirname(path), f))
                           for f in os.listdir(os.path.dirname(path))
                           if f.startswith("model.onnx")) / 2**20
    row["cold_s"], row["cold_mib"], out = dlc_run(dlc, path, inputs)
    row["warm_s"], row["warm_mib"] = warm_run(dlc, path, inputs, out)
    lib = os.path.join(OUT, "outputs", f"{name}.so")
    r = subprocess.run([dlc, "compile", path, "--emit", "so", "-o", lib],
                       capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"dlc compile {path}: {r.stderr.strip()}")
    symbol = entry_symbol(dlc, path)
    # The library's kernels on as many threads as the session it alternates
    # with (OpenMP reads this as it loads): the first worker measures
    # onnxruntime alone at 1 and 2 threads and both alternated at 1, the
    # second both alternated at 2.
    for alternate in (1, 2):
        env = dict(os.environ, OMP_NUM_THREADS=str(alternate))
        worker = subprocess.run([sys.executable, __file__, "--ort", path, out,
                                 json.dumps(inputs), "--lib", lib, "--symbol", symbol,
                                 "--alternate", str(alternate)],
                                check=True, capture_output=True, text=True, env=env)
        w = json.loads(worker.stdout)
        if alternate == 1:
            o = w
        row[f"dlc{alternate}_p25"] = w[f"dlc{alternate}_p25"]
        row[f"ort{alternate}_p25"] = w[f"ort{alternate}_p25"]
    row["error"], row["ort_version"] = o["error"], o["ort_version"]
    for threads in (1, 2):
        t = o[f"ort{threads}"]
        j = dlc_bench(dlc, path, threads, t["runs"], t["warmup"])
        row[f"ort{threads}_ms"], row[f"ort{threads}_spread"] = t["median_ms"], spread(t)
        row[f"dlc{threads}_ms"], row[f"dlc{threads}_spread"] = j["median_ms"], spread(j)
        row[f"runs{threads}"] = t["runs"]
        if threads == 2:
            row["round_trip_ns"] = j.get("core_round_trip_ns")
    print(json.dumps(row), flush=True)
    return row


def cpu_name():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("dlc", nargs="?", default=os.path.join(ROOT, "target", "release", "dlc"))
    ap.add_argument("--only", help="comma-separated model names")
    ap.add_argument("--export", help=argparse.SUPPRESS)
    ap.add_argument("--ort", nargs=3, help=argparse.SUPPRESS)
    ap.add_argument("--lib", help=argparse.SUPPRESS)
    ap.add_argument("--symbol", help=argparse.SUPPRESS)
    ap.add_argument("--alternate", type=int, default=1, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.export:
        export(a.export)
        return 0
    if a.ort:
        threads = (1, 2) if a.alternate == 1 else (a.alternate,)
        ort_worker(a.ort[0], json.loads(a.ort[2]), a.ort[1], threads, a.lib, a.alternate, a.symbol)
        return 0
    only = set(a.only.split(",")) if a.only else None
    os.makedirs(OUT, exist_ok=True)
    rows, failed = [], []
    for name in TESTS + EXPORTED:
        if only is not None and name not in only:
            continue
        try:
            rows.append(measure(a.dlc, name))
        except (RuntimeError, subprocess.CalledProcessError, ValueError) as e:
            why = getattr(e, "stderr", None) or str(e)
            failed.append((name, why.strip().splitlines()[-1][:300]))
            print(f"{name}: failed: {failed[-1][1]}", flush=True)
    lines = [
        f"CPU: {cpu_name()}, {os.cpu_count()} logical cores; onnxruntime "
        f"{rows[0]['ort_version'] if rows else '?'}; medians in ms, spread (max - min) / median "
        "in parentheses; ratio = dlc / onnxruntime (below 1: dlc is faster); cold = `dlc run "
        "--no-cache` (import, compile, one call); warm = a second `dlc run` through the cache "
        "(the program from it, the model not imported); alternated 1t, 2t = the library `dlc "
        "compile --emit so` writes and onnxruntime called alternately in one process at one "
        "and at two threads, 25th percentiles (the steadier comparison: the latency columns "
        "before them are separate runs minutes apart); cores ns = how long a cache line took "
        "between two threads and back after `dlc bench --threads 2` (several hundred: the two "
        "cores shared no cache then, a placement a virtual machine can change for minutes, "
        "in which two threads run slower).",
        "",
        "| model | file MiB | cold dlc run s | peak MiB | warm dlc run s | peak MiB | error vs ort "
        "| dlc 1t | ort 1t | ratio 1t | dlc 2t | ort 2t | ratio 2t | runs | alternated 1t "
        "| alternated 2t | cores ns |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        cells = [r["model"], f"{r['model_mib']:.1f}", f"{r['cold_s']:.2f}", f"{r['cold_mib']:.0f}",
                 f"{r['warm_s']:.2f}", f"{r['warm_mib']:.0f}", f"{r['error']:.1e}"]
        for t in (1, 2):
            cells += [f"{r[f'dlc{t}_ms']:.3f} ({r[f'dlc{t}_spread']:.0%})",
                      f"{r[f'ort{t}_ms']:.3f} ({r[f'ort{t}_spread']:.0%})",
                      f"{r[f'dlc{t}_ms'] / r[f'ort{t}_ms']:.2f}"]
        cells.append(f"{r['runs1']}/{r['runs2']}")
        for t in (1, 2):
            cells.append(f"{r[f'dlc{t}_p25']:.3f} / {r[f'ort{t}_p25']:.3f}: "
                         f"{r[f'dlc{t}_p25'] / r[f'ort{t}_p25']:.2f}")
        ns = r.get("round_trip_ns")
        cells.append("-" if ns is None else f"{ns:.0f}")
        lines.append("| " + " | ".join(cells) + " |")
    for name, why in failed:
        lines.append(f"| {name} | failed: {why} |")
    text = "\n".join(lines) + "\n"
    with open(os.path.join(OUT, "results.md"), "w") as f:
        f.write(text)
    with open(os.path.join(OUT, "results.json"), "w") as f:
        json.dump({"rows": rows, "failed": failed}, f, indent=1)
    print(text)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
