#!/usr/bin/env python3
"""W1..W8 on dlc, onnxruntime and JAX (XLA CPU) side by side, in one run.

Usage: bench_peers.py DLC OUT [--runs N] [--threads "1 2"] [--only ENTRY,...]

For every entry point of examples/w*.dl:
- `dlc run --random-inputs 0 --save-inputs` writes the inputs every contestant
  takes (the same tensors `dlc bench` draws), and dlc's own results;
- a float64 numpy reference is computed from them; a contestant's time counts
  only if its result is within 1e-3 of it (largest absolute error over the
  reference's largest magnitude);
- each contestant runs in a fresh process pinned to as many cores as it has
  threads: `dlc bench --json`, an onnxruntime session (the model built here
  with onnx.helper, weights as initializers, all graph optimizations), a
  jax.jit function; medians of RUNS timed calls after 3 warm-ups, the
  process's peak resident memory, and the cold compile (dlc: source to first
  result; onnxruntime: session creation; JAX: first call less a steady one).
The machine's FP32 FMA peak is measured by scripts/fma_peak.c at each thread
count. Under DLC_CPU (`DLC_CPU=x86-64-v3 make bench-peers`: dlc compiles as
for that CPU), the peak is measured with that CPU's vectors (`-march`), JAX is
held to the same vector width where the CPU is an x86-64 level
(`--xla_cpu_max_isa`), and the report says so; onnxruntime picks its kernels by
what the machine has. Writes OUT/peers.json (one object per line) and
OUT/peers.md.
"""
import json
import math
import os
import subprocess
import sys
import time

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
TOLERANCE = 1e-3
PEERS = ["onnxruntime", "jax"]

# The CPU dlc compiles for: DLC_CPU (any name `dlc --cpu` takes), else this
# machine's. XLA's name for the instructions of each x86-64 level.
CPU = os.environ.get("DLC_CPU", "").strip() or "native"
XLA_MAX_ISA = {"x86-64-v2": "SSE4_2", "x86-64-v3": "AVX2", "x86-64-v4": "AVX512"}

# (entry, file, parameters that are activations; the rest are weights, which
# onnxruntime gets as initializers, as an exported model has them)
WORKLOADS = [
    ("gemm_1024", "w1_gemm.dl", {"a", "b"}),
    ("gemm_2048", "w1_gemm.dl", {"a", "b"}),
    ("mlp", "w2_mlp.dl", {"x"}),
    ("conv_block_b1", "w3_conv_block.dl", {"x"}),
    ("conv_block_b8", "w3_conv_block.dl", {"x"}),
    ("attention", "w4_attention.dl", {"q", "k", "v"}),
    ("layernorm_gelu", "w5_layernorm_gelu.dl", {"x"}),
    ("bert_layer", "w6_bert_layer.dl", {"x"}),
    ("gru", "w7_gru.dl", {"x"}),
    ("gcn", "w8_gcn.dl", {"a", "x"}),
]
FLOPS = {"gemm_1024": 2 * 1024**3, "gemm_2048": 2 * 2048**3}


# ---- the workloads, once for numpy (float64 reference) and JAX ----

def models(xp, conv, gru_steps):
    def softmax(z):
        e = xp.exp(z - z.max(axis=-1, keepdims=True))
        return e / e.sum(axis=-1, keepdims=True)

    def layernorm(z, eps=1e-5):
        mean = z.mean(axis=-1, keepdims=True)
        var = ((z - mean) ** 2).mean(axis=-1, keepdims=True)
        return (z - mean) / xp.sqrt(var + eps)

    def gelu(z):
        return 0.5 * z * (1 + xp.tanh(math.sqrt(2 / math.pi) * (z + 0.044715 * z**3)))

    def relu(z):
        return xp.maximum(z, 0)

    def batchnorm(z, m, v, g, b, eps=1e-5):
        c = lambda t: t[None, :, None, None]
        return (z - c(m)) / xp.sqrt(c(v) + eps) * c(g) + c(b)

    def conv_block(x, w1, m1, v1, g1, b1, w2, m2, v2, g2, b2):
        h = relu(batchnorm(conv(x, w1), m1, v1, g1, b1))
        return relu(batchnorm(conv(h, w2), m2, v2, g2, b2) + x)

    def heads(z):
        return z.reshape(z.shape[0], 12, 64).transpose(1, 0, 2)

    def bert_layer(x, wq, bq, wk, bk, wv, bv, wo, bo, g1, be1, w1, b1, w2, b2, g2, be2):
        q, k, v = heads(x @ wq + bq), heads(x @ wk + bk), heads(x @ wv + bv)
        p = softmax(q @ k.transpose(0, 2, 1) / 8.0)
        ctx = (p @ v).transpose(1, 0, 2).reshape(x.shape[0], 768)
        h1 = layernorm(ctx @ wo + bo + x) * g1 + be1
        ff = gelu(h1 @ w1 + b1) @ w2 + b2
        return layernorm(ff + h1) * g2 + be2

    def gru(x, w_ih, w_hh, b_ih, b_hh):
        H = w_hh.shape[1]

        def cell(h, xt):
            gi = xt @ w_ih.T + b_ih
            gh = h @ w_hh.T + b_hh
            sig = lambda t: 1 / (1 + xp.exp(-t))
            r = sig(gi[:, :H] + gh[:, :H])
            z = sig(gi[:, H:2 * H] + gh[:, H:2 * H])
            n = xp.tanh(gi[:, 2 * H:] + r * gh[:, 2 * H:])
            return (1 - z) * n + z * h

        return gru_steps(cell, xp.zeros((x.shape[1], H), x.dtype), x)

    return {
        "gemm_1024": lambda a, b: a @ b,
        "gemm_2048": lambda a, b: a @ b,
        "mlp": lambda x, w1, b1, w2, b2: relu(x @ w1 + b1) @ w2 + b2,
        "conv_block_b1": conv_block,
        "conv_block_b8": conv_block,
        "attention": lambda q, k, v: softmax(q @ k.transpose(0, 2, 1) / 8.0) @ v,
        "layernorm_gelu": lambda x, g, b: gelu(layernorm(x) * g + b),
        "bert_layer": bert_layer,
        "gru": gru,
        "gcn": lambda a, x, w1, w2: a @ (relu(a @ (x @ w1)) @ w2),
    }


def numpy_models():
    import numpy as np

    def conv(x, w):
        p = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)))
        win = np.lib.stride_tricks.sliding_window_view(p, (3, 3), axis=(2, 3))
        return np.einsum("nchwij,ocij->nohw", win, w, optimize=True)

    def steps(cell, h, xs):
        for t in range(xs.shape[0]):
            h = cell(h, xs[t])
        return h

    return models(np, conv, steps)


def jax_models():
    import jax

    def conv(x, w):
        return jax.lax.conv_general_dilated(x, w, (1, 1), [(1, 1), (1, 1)],
                                            dimension_numbers=("NCHW", "OIHW", "NCHW"))

    def steps(cell, h, xs):
        return jax.lax.scan(lambda h, xt: (cell(h, xt), None), h, xs)[0]

    return models(jax.numpy, conv, steps)


# ---- the same graphs as ONNX models for onnxruntime ----

def onnx_model(entry, names, inputs, activations):
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    nodes, inits, count = [], [], [0]

    def op(kind, *args, **attrs):
        count[0] += 1
        out = f"t{count[0]}"
        nodes.append(helper.make_node(kind, list(args), [out], **attrs))
        return out

    def const(value):
        count[0] += 1
        name = f"c{count[0]}"
        inits.append(numpy_helper.from_array(np.asarray(value), name))
        return name

    def softmax(z):
        return op("Softmax", z, axis=-1)

    def gelu(z):
        return op("Gelu", z, approximate="tanh")

    def layernorm(z, g, b):
        return op("LayerNormalization", z, g, b, axis=-1, epsilon=1e-5)

    def conv_bn(z, w, m, v, g, b):
        return op("BatchNormalization", op("Conv", z, w, pads=[1, 1, 1, 1]), g, b, m, v, epsilon=1e-5)

    def heads(z):
        return op("Transpose", op("Reshape", z, const(np.array([-1, 12, 64], np.int64))), perm=[1, 0, 2])

    a = dict(zip(names, names))
    if entry.startswith("gemm"):
        out = op("MatMul", a["a"], a["b"])
    elif entry == "mlp":
        h = op("Relu", op("Add", op("MatMul", a["x"], a["w1"]), a["b1"]))
        out = op("Add", op("MatMul", h, a["w2"]), a["b2"])
    elif entry.startswith("conv_block"):
        h = op("Relu", conv_bn(a["x"], a["w1"], a["m1"], a["v1"], a["g1"], a["b1"]))
        out = op("Relu", op("Add", conv_bn(h, a["w2"], a["m2"], a["v2"], a["g2"], a["b2"]), a["x"]))
    elif entry == "attention":
        s = op("Div", op("MatMul", a["q"], op("Transpose", a["k"], perm=[0, 2, 1])), const(np.float32(8.0)))
        out = op("MatMul", softmax(s), a["v"])
    elif entry == "layernorm_gelu":
        out = gelu(layernorm(a["x"], a["g"], a["b"]))
    elif entry == "bert_layer":
        proj = lambda w, b: op("Add", op("MatMul", a["x"], a[w]), a[b])
        q, k, v = heads(proj("wq", "bq")), heads(proj("wk", "bk")), heads(proj("wv", "bv"))
        s = op("Div", op("MatMul", q, op("Transpose", k, perm=[0, 2, 1])), const(np.float32(8.0)))
        ctx = op("Reshape", op("Transpose", op("MatMul", softmax(s), v), perm=[1, 0, 2]),
                 const(np.array([-1, 768], np.int64)))
        h1 = layernorm(op("Add", op("Add", op("MatMul", ctx, a["wo"]), a["bo"]), a["x"]), a["g1"], a["be1"])
        ff = op("Add", op("MatMul", gelu(op("Add", op("MatMul", h1, a["w1"]), a["b1"])), a["w2"]), a["b2"])
        out = layernorm(op("Add", ff, h1), a["g2"], a["be2"])
    elif entry == "gru":
        # ONNX's GRU takes gates in the order z, r, h; PyTorch's are r, z, n.
        H = inputs["w_hh"].shape[1]
        order = lambda t: np.concatenate([t[H:2 * H], t[:H], t[2 * H:]])
        w = const(order(inputs["w_ih"])[None])
        r = const(order(inputs["w_hh"])[None])
        b = const(np.concatenate([order(inputs["b_ih"]), order(inputs["b_hh"])])[None])
        count[0] += 1
        y, y_h = f"t{count[0]}a", f"t{count[0]}b"
        nodes.append(helper.make_node("GRU", [a["x"], w, r, b], [y, y_h], hidden_size=H, linear_before_reset=1))
        out = op("Squeeze", y_h, const(np.array([0], np.int64)))
        names = ["x"]
    elif entry == "gcn":
        h = op("Relu", op("MatMul", a["a"], op("MatMul", a["x"], a["w1"])))
        out = op("MatMul", a["a"], op("MatMul", h, a["w2"]))
    else:
        raise SystemExit(f"bench_peers: no ONNX model for {entry}")
    graph_inputs = []
    for n in names:
        if n in activations:
            graph_inputs.append(helper.make_tensor_value_info(n, TensorProto.FLOAT, inputs[n].shape))
        else:
            inits.append(numpy_helper.from_array(inputs[n], n))
    graph = helper.make_graph(nodes, entry, graph_inputs,
                              [helper.make_tensor_value_info(out, TensorProto.FLOAT, None)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])


# ---- one contestant in its own process ----

def worker(peer, entry, data, threads, runs):
    import numpy as np
    names, inputs = load_inputs(data)
    activations = next(w[2] for w in WORKLOADS if w[0] == entry)
    if peer == "onnxruntime":
        import onnxruntime as ort
        model = onnx_model(entry, names, inputs, activations).SerializeToString()
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        start = time.perf_counter()
        session = ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])
        feeds = {n: inputs[n] for n in names if n in activations}
        call = lambda: session.run(None, feeds)[0]
        compile_s = time.perf_counter() - start
        result = call()
    elif peer == "jax":
        import jax
        jax.config.update("jax_platforms", "cpu")
        fn = jax.jit(jax_models()[entry])
        args = [jax.device_put(inputs[n]) for n in names]
        call = lambda: fn(*args).block_until_ready()
        start = time.perf_counter()
        result = call()
        first = time.perf_counter() - start
        start = time.perf_counter()
        call()
        compile_s = max(first - (time.perf_counter() - start), 0.0)
        result = np.asarray(result)
    else:
        raise SystemExit(f"bench_peers: unknown peer {peer}")
    timing = time_calls(call, runs)
    np.save(os.path.join(data, f"{peer}.npy"), np.asarray(result))
    print(json.dumps(dict(timing, compile_s=compile_s)))


def time_calls(call, runs):
    """`call` timed `runs` times after 3 untimed warm-ups: median, min and
    max in ms."""
    import numpy as np
    for _ in range(3):
        call()
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    times = np.array(times) * 1e3
    return {"median_ms": float(np.median(times)), "min_ms": float(times.min()), "max_ms": float(times.max())}


def load_inputs(data):
    import numpy as np
    order = open(os.path.join(data, "order")).read().split()
    return order, {n: np.load(os.path.join(data, "inputs", n + ".npy")) for n in order}


def pinned(threads):
    cpus = sorted(os.sched_getaffinity(0))[:threads]
    return lambda: os.sched_setaffinity(0, cpus)


def run_measured(cmd, threads, env=None):
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=pinned(threads), env=env)
    _, status, usage = os.wait4(proc.pid, 0)
    out, err = proc.stdout.read(), proc.stderr.read()
    code = os.waitstatus_to_exitcode(status)
    if code != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({code}):\n{err[-2000:]}")
    return out, usage.ru_maxrss / 1024


def relative_error(got, ref):
    import numpy as np
    if got.shape != ref.shape:
        return float("inf")
    return float(np.abs(got.astype(np.float64) - ref).max() / max(np.abs(ref).max(), 1e-30))


def arguments():
    """The command line both benchmark scripts take: DLC OUT [--runs N]
    [--threads "1 2"] [--only NAME,...]; OUT is made."""
    import argparse
    p = argparse.ArgumentParser()
    p.add_argument("dlc")
    p.add_argument("out")
    p.add_argument("--runs", type=int, default=20)
    p.add_argument("--threads", default="1 2")
    p.add_argument("--only", default="")
    args = p.parse_args()
    out = os.path.abspath(args.out)
    os.makedirs(out, exist_ok=True)
    threads = [int(t) for t in args.threads.split()]
    only = set(filter(None, args.only.split(",")))
    return args, out, threads, only


def peer_env(threads):
    """A peer's environment at this many threads: OpenMP's and XLA's thread
    counts, and under DLC_CPU, XLA held to that CPU's vectors."""
    return dict(os.environ, OMP_NUM_THREADS=str(threads),
                XLA_FLAGS=f"--xla_cpu_multi_thread_eigen={'true' if threads > 1 else 'false'} "
                          f"intra_op_parallelism_threads={threads}"
                          + (f" --xla_cpu_max_isa={XLA_MAX_ISA[CPU]}" if CPU in XLA_MAX_ISA else ""))


def run_peer(script, peer, name, data, threads, runs, ref):
    """`script --worker peer name data threads runs` in a pinned process:
    its timing JSON with `peak_mib` and `error` (against `ref`) added, or
    `{"failed": ...}`."""
    import numpy as np
    try:
        o, rss = run_measured([sys.executable, script, "--worker", peer, name, data, str(threads), str(runs)],
                              threads, peer_env(threads))
    except RuntimeError as e:
        print(f"{name} {threads}t {peer}: {e}", file=sys.stderr)
        return {"failed": str(e)[-300:]}
    r = json.loads(o.strip().splitlines()[-1])
    r.update(peak_mib=rss, error=relative_error(np.load(os.path.join(data, f"{peer}.npy")), ref))
    return r


def main():
    import numpy as np
    args, out, threads, only = arguments()
    rows = []

    peak_bin = os.path.join(out, "fma_peak")
    subprocess.run(["cc", "-O2", f"-march={CPU}", "-ffp-contract=fast", "-pthread",
                    os.path.join(ROOT, "scripts", "fma_peak.c"), "-o", peak_bin], check=True)
    peak = {}
    for t in threads:
        o, _ = run_measured([peak_bin, str(t)], t)
        peak[t] = json.loads(o)["gflops"]
        rows.append({"kind": "peak", "threads": t, "gflops": peak[t]})
        print(f"FMA peak, {t} thread(s): {peak[t]:.1f} GFLOP/s", file=sys.stderr)

    references = numpy_models()
    for entry, file, _ in WORKLOADS:
        if only and entry not in only:
            continue
        source = os.path.join(ROOT, "examples", file)
        data = os.path.join(out, "data", entry)
        os.makedirs(data, exist_ok=True)
        subprocess.run([args.dlc, "run", source, "--entry", entry, "--backend", "cpu", "--random-inputs", "0",
                        "--save-inputs", os.path.join(data, "inputs"), "--save-outputs", os.path.join(data, "dlc")],
                       check=True, stdout=subprocess.DEVNULL)
        names = parameters(entry, os.listdir(os.path.join(data, "inputs")))
        open(os.path.join(data, "order"), "w").write(" ".join(names))
        names, inputs = load_inputs(data)
        ref = references[entry](*[inputs[n].astype(np.float64) for n in names])
        errors = {"dlc": relative_error(np.load(os.path.join(data, "dlc", "out0.npy")), ref)}
        for t in threads:
            env = dict(os.environ, OMP_NUM_THREADS=str(t))
            o, rss = run_measured([args.dlc, "bench", source, "--entry", entry, "--threads", str(t),
                                   "--runs", str(args.runs), "--json"], t, env)
            r = json.loads(o)
            rows.append(dict(kind="time", entry=entry, who="dlc", threads=t, median_ms=r["median_ms"],
                             min_ms=r["min_ms"], max_ms=r["max_ms"], compile_s=r["compile_s"],
                             peak_mib=rss, error=errors["dlc"]))
            print(f"{entry} {t}t dlc {r['median_ms']:.3f} ms (error {errors['dlc']:.1e})", file=sys.stderr)
            for peer in PEERS:
                r = run_peer(os.path.abspath(__file__), peer, entry, data, t, args.runs, ref)
                rows.append(dict(kind="time", entry=entry, who=peer, threads=t, **r))
                if "failed" in r:
                    continue
                err = r["error"]
                print(f"{entry} {t}t {peer} {r['median_ms']:.3f} ms (error {err:.1e})", file=sys.stderr)
    with open(os.path.join(out, "peers.json"), "w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
    table = report(rows, threads, peak)
    open(os.path.join(out, "peers.md"), "w").write(table)
    print(table)


def parameters(entry, files):
    """The entry's parameter names in source order (the reference function
    names them as the .dl file does), checked against the inputs
    `dlc run --save-inputs` wrote."""
    import inspect
    saved = {f[:-4] for f in files if f.endswith(".npy")}
    source_order = list(inspect.signature(numpy_models()[entry]).parameters)
    if set(source_order) != saved:
        raise SystemExit(f"bench_peers: {entry}'s parameters {sorted(saved)} are not the ones this script knows")
    return source_order


def report(rows, threads, peak):
    times = {}
    for r in rows:
        if r["kind"] == "time" and "median_ms" in r and r.get("error", 1) <= TOLERANCE:
            times[(r["entry"], r["who"], r["threads"])] = r
    entries = [w[0] for w in WORKLOADS if any(k[0] == w[0] for k in times)]
    lines = [f"FMA peak (scripts/fma_peak.c, -march={CPU}): " +
             ", ".join(f"{peak[t]:.1f} GFLOP/s on {t} thread(s)" for t in threads), ""]
    if CPU != "native":
        lines[-1:-1] = [f"dlc compiled for DLC_CPU={CPU}; JAX held to "
                        f"{XLA_MAX_ISA.get(CPU, 'this machine')}'s instructions; onnxruntime used this machine's.", ""]
    header = "| workload |"
    rule = "|---|"
    for t in threads:
        header += f" dlc {t}t (ms) | best peer {t}t (ms) | dlc / best {t}t |"
        rule += "---|---|---|"
    # dlc compiles on every core its process may use (it is pinned to as many
    # cores as it has threads): the compile of the run on the most cores.
    header += f" dlc compile (s, {threads[-1]} core{'s' if threads[-1] > 1 else ''}) | dlc peak MiB | best peer peak MiB |"
    rule += "---|---|---|"
    lines += [header, rule]
    ratios = {t: [] for t in threads}
    for e in entries:
        line = f"| {e} |"
        mem = []
        for t in threads:
            d = times.get((e, "dlc", t))
            peers = [times[(e, p, t)] for p in PEERS if (e, p, t) in times]
            best = min(peers, key=lambda r: r["median_ms"]) if peers else None
            dms = f"{d['median_ms']:.3f}" if d else "failed"
            if d and e in FLOPS:
                g = FLOPS[e] / d["median_ms"] / 1e6
                dms += f" ({g:.0f} GFLOP/s, {100 * g / peak[t]:.0f}% of peak)"
            bms = f"{best['median_ms']:.3f} {best['who']}" if best else "none"
            ratio = d["median_ms"] / best["median_ms"] if d and best else None
            if ratio and not e.startswith("gemm"):
                ratios[t].append(ratio)
            line += f" {dms} | {bms} | {f'{ratio:.2f}' if ratio else '-'} |"
            if d:
                mem.append((d["peak_mib"], min((p["peak_mib"] for p in peers), default=None)))
        dc = times.get((e, "dlc", threads[-1]))
        line += f" {dc['compile_s']:.3f} |" if dc else " - |"
        line += f" {max(m[0] for m in mem):.0f} |" if mem else " - |"
        line += f" {max(m[1] for m in mem if m[1]):.0f} |" if mem and any(m[1] for m in mem) else " - |"
        lines.append(line)
    lines.append("")
    for t in threads:
        if ratios[t]:
            g = math.exp(sum(math.log(r) for r in ratios[t]) / len(ratios[t]))
            lines.append(f"Geometric mean of dlc / best peer over W2..W8, {t} thread(s): {g:.2f}")
    failed = [r for r in rows if r["kind"] == "time" and ("failed" in r or r.get("error", 0) > TOLERANCE)]
    for r in failed:
        why = r.get("failed") or f"error {r['error']:.1e} above {TOLERANCE}"
        lines.append(f"Not counted: {r['entry']} {r['who']} {r['threads']}t: {why.splitlines()[-1]}")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        worker(sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5]), int(sys.argv[6]))
    else:
        main()
