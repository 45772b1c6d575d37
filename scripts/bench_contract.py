#!/usr/bin/env python3
"""Contractions written in index notation (bench/contract/*.dl) on dlc, against
the same computation in PyTorch (eager) and JAX (jax.jit, XLA CPU), in one run.

Usage: bench_contract.py DLC OUT [--runs N] [--threads "1 2"] [--only NAME,...]

For every case:
- `dlc run --backend cpu --random-inputs 0 --save-inputs` writes the inputs
  every contestant takes, and dlc's results;
- a float64 reference is computed from them with PyTorch; a contestant's time
  counts only if its result is within 1e-3 of it (largest absolute error over
  the reference's largest magnitude; bf16 cases within 2e-2);
- each contestant runs in a fresh process pinned to as many cores as it has
  threads: `dlc bench --json`, the PyTorch function (torch.set_num_threads),
  the jax.jit function (XLA's thread flags, as bench_peers.py sets them);
  medians of RUNS timed calls after 3 warm-ups.
Writes OUT/contract.json (one object per line) and OUT/contract.md: medians,
min-max spread, and dlc / best peer at each thread count, with the geometric
mean. Under DLC_CPU, JAX is held to that CPU's vectors as in bench_peers.py.
"""
import json
import math
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_peers import CPU, arguments, relative_error, run_measured, run_peer  # noqa: E402

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
PEERS = ["pytorch", "jax"]


def cases(lib):
    """Each case as a function of its parameters in the .dl file's order, for
    PyTorch (`lib` = "torch") or JAX ("jax")."""
    if lib == "torch":
        import torch
        import torch.nn.functional as F
        T = lambda t: t.transpose(-1, -2)
        sigmoid = torch.sigmoid
        conv_dx = lambda g, w: F.conv_transpose2d(g, w, padding=1)
        conv_dw = lambda x, g: torch.nn.grad.conv2d_weight(x, (g.shape[1], x.shape[1], 3, 3), g, padding=1)
        conv1x1 = lambda x, w: F.conv2d(x, w[:, :, None, None])
        depthwise = lambda x, w: F.conv2d(x, w[:, None], padding=1, groups=x.shape[1])
        strided = lambda x, w: F.conv2d(x, w, stride=2, padding=1)
        einsum = torch.einsum
    else:
        import jax
        import jax.numpy as jnp
        T = lambda t: jnp.swapaxes(t, -1, -2)
        sigmoid = jax.nn.sigmoid
        dn = ("NCHW", "OIHW", "NCHW")
        conv = lambda x, w: jax.lax.conv_general_dilated(x, w, (1, 1), [(1, 1), (1, 1)], dimension_numbers=dn)
        # The gradients as JAX computes them in training: the vector-Jacobian
        # products of the forward convolution.
        conv_dx = lambda g, w: jax.vjp(lambda x: conv(x, w), jnp.zeros((g.shape[0], w.shape[1]) + g.shape[2:], g.dtype))[1](g)[0]
        conv_dw = lambda x, g: jax.vjp(lambda w: conv(x, w), jnp.zeros((g.shape[1], x.shape[1], 3, 3), x.dtype))[1](g)[0]
        conv1x1 = lambda x, w: jax.lax.conv_general_dilated(x, w[:, :, None, None], (1, 1), "VALID", dimension_numbers=dn)
        depthwise = lambda x, w: jax.lax.conv_general_dilated(x, w[:, None], (1, 1), [(1, 1), (1, 1)],
                                                              dimension_numbers=dn, feature_group_count=x.shape[1])
        strided = lambda x, w: jax.lax.conv_general_dilated(x, w, (2, 2), [(1, 1), (1, 1)], dimension_numbers=dn)
        einsum = jnp.einsum
    return {
        "at_g": lambda a, g: T(a) @ g,
        "g_bt": lambda g, b: g @ T(b),
        "scores": lambda q, k: q @ T(k),
        "dense_gate": lambda x, w, b: (lambda h: h * sigmoid(h))(x @ w + b),
        "shared_weight": lambda x, w: x @ w,
        "conv1x1": conv1x1,
        "conv_dx": conv_dx,
        "conv_dw": conv_dw,
        "two_reductions": lambda a, b: einsum("ikl,klj->ij", a, b),
        "bf16_gemm": lambda a, b: a @ b,
        "f16_gemm": lambda a, b: a @ b,
        "depthwise": depthwise,
        "strided_conv": strided,
    }


def parameters(name):
    """The case's parameters, (name, element type), in the .dl file's order
    (its `fn main`)."""
    import re
    text = open(os.path.join(ROOT, "bench", "contract", name + ".dl")).read()
    sig = re.search(r"fn main\(([^)]*)\)", text).group(1)
    return [tuple(x.strip() for x in p.split("[")[0].split(":")) for p in re.split(r",(?![^\[]*\])", sig)]


def load(data, params):
    """The inputs dlc drew, as NumPy arrays (f16 and bf16 ones widened to f32
    by `--save-inputs`, exactly), with their element types."""
    import numpy as np
    return [(np.load(os.path.join(data, "inputs", n + ".npy")), t) for n, t in params]


def to_torch(x):
    import torch
    a, t = x
    return torch.from_numpy(a).to({"bf16": torch.bfloat16, "f16": torch.float16}.get(t, torch.float32))


def worker(peer, name, data, threads, runs):
    import numpy as np
    xs = load(data, parameters(name))
    if peer == "pytorch":
        import torch
        torch.set_num_threads(threads)
        fn = cases("torch")[name]
        args = [to_torch(x) for x in xs]
        with torch.no_grad():
            call = lambda: fn(*args)
            result = call()
            out = result.float().numpy()
            timed = call
    else:
        import jax
        jax.config.update("jax_platforms", "cpu")
        fn = jax.jit(cases("jax")[name])
        import jax.numpy as jnp
        kind = {"bf16": jnp.bfloat16, "f16": jnp.float16}
        args = [jax.device_put(jnp.asarray(a, kind.get(t, jnp.float32))) for a, t in xs]
        timed = lambda: fn(*args).block_until_ready()
        out = np.asarray(timed()).astype(np.float32)
    for _ in range(3):
        timed()
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        timed()
        times.append(time.perf_counter() - start)
    np.save(os.path.join(data, f"{peer}.npy"), out)
    times = np.array(times) * 1e3
    print(json.dumps({"median_ms": float(np.median(times)), "min_ms": float(times.min()),
                      "max_ms": float(times.max())}))


def reference(name, xs):
    import torch
    fn = cases("torch")[name]
    with torch.no_grad():
        return fn(*[to_torch(x).double() for x in xs]).numpy()


def report(rows, threads):
    lines = [f"Contractions in index notation: dlc against PyTorch {torch_version()} (eager) and "
             f"JAX {jax_version()} (jit), medians in ms (min-max) of each process's runs, "
             f"CPU: {cpu_name()}" + (f", DLC_CPU={CPU}" if CPU != "native" else "") + ".", ""]
    head = "| case |" + "".join(f" dlc {t}t | pytorch {t}t | jax {t}t | dlc / best {t}t |" for t in threads)
    lines += [head, "|---|" + "---|---|---|---|" * len(threads)]
    ratios = {t: [] for t in threads}
    names = list(dict.fromkeys(r["case"] for r in rows))
    for name in names:
        cells = []
        for t in threads:
            got = {r["who"]: r for r in rows if r["case"] == name and r["threads"] == t}
            def cell(who):
                r = got.get(who)
                if r is None or "median_ms" not in r:
                    return "failed"
                mark = "" if r["ok"] else " (wrong)"
                return f"{r['median_ms']:.2f} ({r['min_ms']:.2f}-{r['max_ms']:.2f}){mark}"
            peers = [got[p]["median_ms"] for p in PEERS if p in got and got[p].get("ok")]
            dlc = got.get("dlc")
            ratio = ""
            if dlc and dlc.get("ok") and peers:
                q = dlc["median_ms"] / min(peers)
                ratios[t].append(q)
                ratio = f"{q:.2f}"
            cells += [cell("dlc"), cell("pytorch"), cell("jax"), ratio]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    geo = [f"{math.exp(sum(map(math.log, ratios[t])) / len(ratios[t])):.2f}" if ratios[t] else "" for t in threads]
    lines.append("| geometric mean |" + "".join(f" | | | {g} |" for g in geo))
    return "\n".join(lines) + "\n"


def torch_version():
    import torch
    return torch.__version__.split("+")[0]


def jax_version():
    import jax
    return jax.__version__


def cpu_name():
    for line in open("/proc/cpuinfo"):
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return "unknown"


def main():
    import numpy as np
    args, out, threads, only = arguments()
    known = cases("torch")
    files = sorted(f[:-3] for f in os.listdir(os.path.join(ROOT, "bench", "contract")) if f.endswith(".dl"))
    unknown = [f for f in files if f not in known]
    if unknown:
        raise SystemExit(f"bench_contract: no PyTorch/JAX version of {unknown}")
    rows = []
    for name in files:
        if only and name not in only:
            continue
        source = os.path.join(ROOT, "bench", "contract", name + ".dl")
        data = os.path.join(out, "contract", name)
        os.makedirs(data, exist_ok=True)
        subprocess.run([args.dlc, "run", source, "--backend", "cpu", "--random-inputs", "0",
                        "--save-inputs", os.path.join(data, "inputs"), "--save-outputs", os.path.join(data, "dlc")],
                       check=True, stdout=subprocess.DEVNULL)
        xs = load(data, parameters(name))
        ref = reference(name, xs)
        bound = 2e-2 if any(t in ("bf16", "f16") for _, t in xs) else 1e-3
        dlc_out = np.load(os.path.join(data, "dlc", "out0.npy")).astype(np.float32)
        dlc_err = relative_error(dlc_out, ref)
        for t in threads:
            env = dict(os.environ, OMP_NUM_THREADS=str(t))
            o, _ = run_measured([args.dlc, "bench", source, "--threads", str(t), "--runs", str(args.runs),
                                 "--json"], t, env)
            r = json.loads(o)
            rows.append(dict(case=name, who="dlc", threads=t, median_ms=r["median_ms"], min_ms=r["min_ms"],
                             max_ms=r["max_ms"], error=dlc_err, ok=dlc_err <= bound))
            print(f"{name} {t}t dlc {r['median_ms']:.3f} ms (error {dlc_err:.1e})", file=sys.stderr)
            for peer in PEERS:
                r = run_peer(os.path.abspath(__file__), peer, name, data, t, args.runs, ref)
                rows.append(dict(case=name, who=peer, threads=t, **r))
                if "failed" in r:
                    continue
                err = r["error"]
                rows[-1]["ok"] = err <= bound
                print(f"{name} {t}t {peer} {r['median_ms']:.3f} ms (error {err:.1e})", file=sys.stderr)
    with open(os.path.join(out, "contract.json"), "w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
    table = report(rows, threads)
    open(os.path.join(out, "contract.md"), "w").write(table)
    print(table)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        worker(sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5]), int(sys.argv[6]))
    else:
        main()
