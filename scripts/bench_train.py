#!/usr/bin/env python3
"""One training step (forward, backward, SGD update) of the W2, W3 b8, W4, W6,
W7 and W8 models on dlc, PyTorch (eager and torch.compile) and JAX (jit of
value_and_grad and the update), same batch, same loss, same optimizer, at 1
and 2 threads, in one run; and the gradients of those losses, computed by dlc,
against JAX's. W4 trains its three inputs, W8 its two weights (its adjacency
and features are data); the others every parameter but the first. Three
networks built from user operators (USER_OPS: u1_wavenet, u2_gated_gcn,
u3_rel_attention) run the same way, the peers composing primitives.

Usage: bench_train.py DLC OUT [--runs N] [--threads "1 2"] [--only NAME,...]

Each model's loss is the mean squared error of its output against a target of
the output's shape; W3 normalizes by batch statistics (`batchnorm_train`; the
running averages are not part of the loss). The step is plain SGD at 0.01:
`w -= 0.01 * grad`, what every framework computes alike. The dlc program is
the workload's file with a loss and a step appended (OUT/train/NAME.dl);
`dlc bench --entry NAME_step` times it on random inputs. The gradient check
runs `dlc grad --backend cpu` and `jax.grad` on the same inputs (written by
`dlc run --save-inputs`) and reports the largest error relative to each
gradient's largest magnitude. Peers run in fresh processes pinned to as many
cores as they have threads (bench_peers.py's rules). Writes OUT/train.json
and OUT/train.md (medians, min-max, dlc / best peer, peak memory, and the
geometric mean of the best peer's median over dlc's).

Mixed precision: NAME_bf16 (W2 and W6) is NAME's step with bf16 products
from f32 weights, `value_and_grad(.., autocast=bf16)` in dlc (what `dlc
train --precision bf16` runs), `torch.autocast("cpu", bfloat16)` in PyTorch,
and in JAX the model computed on bf16 copies of its inputs and weights (JAX
has no autocast: a compute-dtype policy as jmp sets one), the loss in f32.
Their gradients are not checked (NAME's are).
"""
import json
import math
import os
import shutil
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_peers import CPU, arguments, peer_env, run_measured, time_calls  # noqa: E402
import torch_workloads  # noqa: E402

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
PEERS = ["pytorch", "torch.compile", "jax"]
LR = 0.01

# name: (workload file, its entry, its parameters in order, the output's
# shape, the parameters trained (none: all but the first), whether the step
# is timed)
MODELS = {
    "w2_mlp": ("w2_mlp.dl", "mlp", ["x", "w1", "b1", "w2", "b2"], [128, 1024], None, True),
    "w3_conv_block_b8": (None, "block_train", ["x", "w1", "g1", "b1", "w2", "g2", "b2"], [8, 64, 56, 56],
                         None, True),
    "w4_attention": ("w4_attention.dl", "attention", ["q", "k", "v"], [12, 384, 64], ["q", "k", "v"], True),
    "w6_bert_layer": ("w6_bert_layer.dl", "bert_layer",
                      ["x", "wq", "bq", "wk", "bk", "wv", "bv", "wo", "bo", "g1", "be1",
                       "w1", "b1", "w2", "b2", "g2", "be2"], [128, 768], None, True),
    "w7_gru": ("w7_gru.dl", "gru", ["x", "w_ih", "w_hh", "b_ih", "b_hh"], [64, 512], None, True),
    "w8_gcn": ("w8_gcn.dl", "gcn", ["a", "x", "w1", "w2"], [2708, 7], ["w1", "w2"], True),
    # Networks of user operators (USER_OPS below), where the peers compose
    # primitives.
    "u1_wavenet": (None, "wavenet", ["x"] + [f"{w}{i}" for i in range(1, 5) for w in "fgr"],
                   [8, 32, 1024], None, True),
    "u2_gated_gcn": (None, "gated_gcn", ["a", "x", "w1", "p1", "q1", "w2"], [2708, 7],
                     ["w1", "p1", "q1", "w2"], True),
    "u3_rel_attention": (None, "rel_attention", ["q", "k", "v", "rel"], [2, 12, 384, 64],
                         ["q", "k", "v", "rel"], True),
}


# NAME_bf16: NAME's step with bf16 products (see the docstring).
NARROW = {"w2_mlp_bf16": "w2_mlp", "w6_bert_layer_bf16": "w6_bert_layer"}


def base(name):
    """The model a variant is of (itself for the models of MODELS)."""
    return NARROW.get(name, name)


def trained(name):
    """The parameters a model's step trains: all but the first (the input)
    unless listed."""
    _, _, params, _, wrt, _ = MODELS[base(name)]
    return wrt or params[1:]


W3_TRAIN = """
// W3 b8's block in training mode: batch statistics instead of fixed ones.
fn block_train(x: f32[8, 64, 56, 56], w1: f32[64, 64, 3, 3], g1: f32[64], b1: f32[64],
               w2: f32[64, 64, 3, 3], g2: f32[64], b2: f32[64]) -> f32[8, 64, 56, 56] {
    let stat = zeros([64]);
    let (h0, m1, v1) = batchnorm_train(conv2d(x, w1, padding=1), g1, b1, stat, stat);
    let (y, m2, v2) = batchnorm_train(conv2d(relu(h0), w2, padding=1), g2, b2, stat, stat);
    return relu(y + x);
}
"""


# Three networks built from user operators (issue 34): a WaveNet-style stack
# of gated dilated causal convolutions (dilations 1, 2, 4, 8, kernel 2, 1x1
# residual mixes), a graph convolution whose edges are gated by a learned
# score of both ends (`a[i, j] * sigmoid(s[i] + t[j])`, dense adjacency, the
# Cora sizes of W8), and attention with a learned relative-position bias per
# head (T5's, one weight per offset `i - j`).
USER_OPS = {
    "u1_wavenet": """
op causal1[N, C, T, O](x: f32[N, C, T], w: f32[O, C, 2]) -> f32[N, O, T] { out[n, o, t] = sum[c, k](x[n, c, t - k] * w[o, c, k]); }
op causal2[N, C, T, O](x: f32[N, C, T], w: f32[O, C, 2]) -> f32[N, O, T] { out[n, o, t] = sum[c, k](x[n, c, t - 2 * k] * w[o, c, k]); }
op causal4[N, C, T, O](x: f32[N, C, T], w: f32[O, C, 2]) -> f32[N, O, T] { out[n, o, t] = sum[c, k](x[n, c, t - 4 * k] * w[o, c, k]); }
op causal8[N, C, T, O](x: f32[N, C, T], w: f32[O, C, 2]) -> f32[N, O, T] { out[n, o, t] = sum[c, k](x[n, c, t - 8 * k] * w[o, c, k]); }
op mix[N, C, T, O](z: f32[N, C, T], w: f32[O, C]) -> f32[N, O, T] { out[n, o, t] = sum[c](w[o, c] * z[n, c, t]); }

fn wavenet(x: f32[8, 32, 1024], f1: f32[32, 32, 2], g1: f32[32, 32, 2], r1: f32[32, 32],
           f2: f32[32, 32, 2], g2: f32[32, 32, 2], r2: f32[32, 32],
           f3: f32[32, 32, 2], g3: f32[32, 32, 2], r3: f32[32, 32],
           f4: f32[32, 32, 2], g4: f32[32, 32, 2], r4: f32[32, 32]) -> f32[8, 32, 1024] {
    let h1 = x + mix(tanh(causal1(x, f1)) * sigmoid(causal1(x, g1)), r1);
    let h2 = h1 + mix(tanh(causal2(h1, f2)) * sigmoid(causal2(h1, g2)), r2);
    let h3 = h2 + mix(tanh(causal4(h2, f3)) * sigmoid(causal4(h2, g3)), r3);
    return h3 + mix(tanh(causal8(h3, f4)) * sigmoid(causal8(h3, g4)), r4);
}
""",
    "u2_gated_gcn": """
op gated_agg[N, G](a: f32[N, N], s: f32[N], t: f32[N], h: f32[N, G]) -> f32[N, G] {
    out[i, g] = sum[j](a[i, j] * sigmoid(s[i] + t[j]) * h[j, g]);
}

fn gated_gcn(a: f32[2708, 2708], x: f32[2708, 1433], w1: f32[1433, 16], p1: f32[16], q1: f32[16],
             w2: f32[16, 7]) -> f32[2708, 7] {
    let h = x @ w1;
    let h1 = relu(gated_agg(a, h @ p1, h @ q1, h));
    return a @ (h1 @ w2);
}
""",
    "u3_rel_attention": """
op rel_scores[B, H, L, D](q: f32[B, H, L, D], k: f32[B, H, L, D], rel: f32[H, 767]) -> f32[B, H, L, L] {
    out[b, h, i, j] = sum[d](q[b, h, i, d] * k[b, h, j, d]) * 0.125 + rel[h, i - j + 383];
}

fn rel_attention(q: f32[2, 12, 384, 64], k: f32[2, 12, 384, 64], v: f32[2, 12, 384, 64],
                 rel: f32[12, 767]) -> f32[2, 12, 384, 64] {
    return softmax(rel_scores(q, k, rel), axis=-1) @ v;
}
""",
}
INLINE = {"w3_conv_block_b8": W3_TRAIN, **USER_OPS}


def program(name):
    """The model's dlc program and its entry's parameter types by name."""
    file, entry, _, _, _, _ = MODELS[base(name)]
    text = open(os.path.join(ROOT, "examples", file)).read() if file else INLINE[base(name)]
    start = text.index(f"fn {entry}(") + len(f"fn {entry}(")
    depth, i = 1, start
    while depth:
        depth += {"(": 1, ")": -1}.get(text[i], 0)
        i += 1
    decl = text[start:i - 1]
    types = {}
    # Parameter declarations, without `weight` (the step's weights change
    # every call: nothing may be prepared once).
    items, level, cur = [], 0, ""
    for ch in decl:
        if ch == "," and level == 0:
            items.append(cur)
            cur = ""
            continue
        level += {"[": 1, "]": -1}.get(ch, 0)
        cur += ch
    items.append(cur)
    for it in items:
        n, t = it.strip().replace("weight ", "").split(":")
        types[n.strip()] = t.strip()
    return text, types


def source(name):
    """The model's dlc program with `NAME_loss` and `NAME_step` appended."""
    _, entry, params, out, _, _ = MODELS[base(name)]
    text, types = program(name)
    out_ty = "f32[" + ", ".join(map(str, out)) + "]"
    plist = ", ".join(f"{p}: {types[p]}" for p in params)
    weights = trained(name)
    call = f"{entry}({', '.join(params)})"
    grads = ", ".join(f"g_{w}" for w in weights)
    new = ", ".join(f"sgd({w}, g_{w}, {LR})" for w in weights)
    rets = ", ".join(["f32"] + [types[w] for w in weights])
    return text + f"""
fn {name}_loss({plist}, y: {out_ty}) -> f32 {{
    return mse_loss({call}, y);
}}

fn {name}_step({plist}, y: {out_ty}) -> ({rets}) {{
    let (l, {grads}) = value_and_grad({name}_loss({', '.join(params)}, y), wrt=[{', '.join(weights)}]{', autocast=bf16' if name in NARROW else ''});
    return (l, {new});
}}
"""


def torch_models(torch):
    F = torch.nn.functional
    w = torch_workloads.models(torch)

    def bn_train(z, g, b):
        m = z.mean(dim=(0, 2, 3), keepdim=True)
        v = ((z - m) ** 2).mean(dim=(0, 2, 3), keepdim=True)
        c = lambda t: t[None, :, None, None]
        return (z - m) / torch.sqrt(v + 1e-5) * c(g) + c(b)

    def block_train(x, w1, g1, b1, w2, g2, b2):
        h = torch.relu(bn_train(F.conv2d(x, w1, padding=1), g1, b1))
        return torch.relu(bn_train(F.conv2d(h, w2, padding=1), g2, b2) + x)

    def causal(x, w, d):
        # dlc's `x[t - d k] * w[k]` as a cross-correlation over the left-padded input.
        return F.conv1d(F.pad(x, (d, 0)), w.flip(-1), dilation=d)

    def wavenet(x, *ws):
        h = x
        for i, d in enumerate([1, 2, 4, 8]):
            f, g, r = ws[3 * i:3 * i + 3]
            h = h + F.conv1d(torch.tanh(causal(h, f, d)) * torch.sigmoid(causal(h, g, d)), r[:, :, None])
        return h

    def gated_gcn(a, x, w1, p1, q1, w2):
        h = x @ w1
        gate = torch.sigmoid((h @ p1)[:, None] + (h @ q1)[None, :])
        return a @ (torch.relu((a * gate) @ h) @ w2)

    def rel_attention(q, k, v, rel):
        n = q.shape[2]
        offset = torch.arange(n)[:, None] - torch.arange(n)[None, :] + 383
        return torch.softmax(q @ k.transpose(-1, -2) * 0.125 + rel[:, offset], dim=-1) @ v

    return {"w2_mlp": w["mlp"], "w3_conv_block_b8": block_train, "w4_attention": w["attention"],
            "w6_bert_layer": w["bert_layer"], "w7_gru": w["gru"], "w8_gcn": w["gcn"],
            "u1_wavenet": wavenet, "u2_gated_gcn": gated_gcn, "u3_rel_attention": rel_attention}


def jax_model(name):
    import jax
    import jax.numpy as jnp
    from bench_peers import jax_models
    if name in USER_OPS:
        return jax_user_ops()[name]
    if name != "w3_conv_block_b8":
        return jax_models()[MODELS[name][1]]

    def conv(x, w):
        return jax.lax.conv_general_dilated(x, w, (1, 1), [(1, 1), (1, 1)],
                                            dimension_numbers=("NCHW", "OIHW", "NCHW"))

    def bn_train(z, g, b):
        m = z.mean(axis=(0, 2, 3), keepdims=True)
        v = ((z - m) ** 2).mean(axis=(0, 2, 3), keepdims=True)
        c = lambda t: t[None, :, None, None]
        return (z - m) / jnp.sqrt(v + 1e-5) * c(g) + c(b)

    def block_train(x, w1, g1, b1, w2, g2, b2):
        h = jax.nn.relu(bn_train(conv(x, w1), g1, b1))
        return jax.nn.relu(bn_train(conv(h, w2), g2, b2) + x)
    return block_train


def jax_user_ops():
    """USER_OPS's networks in JAX, as PyTorch's above."""
    import jax
    import jax.numpy as jnp

    def causal(x, w, d):
        x = jnp.pad(x, ((0, 0), (0, 0), (d, 0)))
        return jax.lax.conv_general_dilated(x, w[:, :, ::-1], (1,), "VALID", rhs_dilation=(d,),
                                            dimension_numbers=("NCH", "OIH", "NCH"))

    def wavenet(x, *ws):
        h = x
        for i, d in enumerate([1, 2, 4, 8]):
            f, g, r = ws[3 * i:3 * i + 3]
            h = h + jnp.einsum("oc,nct->not", r, jnp.tanh(causal(h, f, d)) * jax.nn.sigmoid(causal(h, g, d)))
        return h

    def gated_gcn(a, x, w1, p1, q1, w2):
        h = x @ w1
        gate = jax.nn.sigmoid((h @ p1)[:, None] + (h @ q1)[None, :])
        return a @ (jax.nn.relu((a * gate) @ h) @ w2)

    def rel_attention(q, k, v, rel):
        n = q.shape[2]
        offset = jnp.arange(n)[:, None] - jnp.arange(n)[None, :] + 383
        return jax.nn.softmax(q @ jnp.swapaxes(k, -1, -2) * 0.125 + rel[:, offset], axis=-1) @ v

    return {"u1_wavenet": wavenet, "u2_gated_gcn": gated_gcn, "u3_rel_attention": rel_attention}


def worker(peer, name, data, threads, runs):
    import numpy as np
    params = MODELS[base(name)][2]
    wrt = trained(name)
    inputs = {p: np.load(os.path.join(data, "inputs", p + ".npy")) for p in params + ["y"]}
    narrow = name in NARROW

    def arguments(ws, given):
        """The model's arguments in order: the trained ones from `ws`."""
        return [ws[wrt.index(p)] if p in wrt else given[p] for p in params]
    if peer in ("pytorch", "torch.compile"):
        import torch
        torch.set_num_threads(threads)
        model = torch_models(torch)[base(name)]
        if peer == "torch.compile":
            model = torch.compile(model)
        given = {p: torch.from_numpy(a) for p, a in inputs.items()}
        y = given["y"]
        ws = [given[p].clone().requires_grad_(True) for p in wrt]

        def call():
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=narrow):
                out = model(*arguments(ws, given))
            loss = ((out.float() - y) ** 2).mean()
            grads = torch.autograd.grad(loss, ws)
            with torch.no_grad():
                for w, g in zip(ws, grads):
                    w -= LR * g
            return loss
    else:
        import jax
        jax.config.update("jax_platforms", "cpu")
        import jax.numpy as jnp
        model = jax_model(base(name))
        cast = (lambda a: a.astype(jnp.bfloat16)) if narrow else (lambda a: a)

        def loss_fn(ws, given, y):
            out = model(*[cast(a) for a in arguments(ws, given)])
            return ((out.astype(jnp.float32) - y) ** 2).mean()

        @jax.jit
        def step(ws, given, y):
            loss, grads = jax.value_and_grad(loss_fn)(ws, given, y)
            return loss, [w - LR * g for w, g in zip(ws, grads)]
        on = {p: jax.device_put(a) for p, a in inputs.items()}
        given = {p: a for p, a in on.items() if p not in wrt and p != "y"}
        state = {"ws": [on[p] for p in wrt]}

        def call():
            loss, state["ws"] = step(state["ws"], given, on["y"])
            return loss.block_until_ready()
    start = time.perf_counter()
    call()
    compile_s = time.perf_counter() - start
    print(json.dumps(dict(time_calls(call, runs), compile_s=compile_s)))


def grad_check(dlc, name, path, data):
    """dlc's gradients (compiled for this CPU) against jax.grad's in f64, on
    the inputs `dlc run --save-inputs` wrote: prints the largest error of a
    trained parameter's gradient relative to that gradient's largest
    magnitude (see below)."""
    import numpy as np
    import jax
    jax.config.update("jax_platforms", "cpu")
    jax.config.update("jax_enable_x64", True)
    params = MODELS[name][2]
    wrt = trained(name)
    out = os.path.join(data, "grads")
    files = sum((["--input", f"{p}={os.path.join(data, 'inputs', p + '.npy')}"] for p in params + ["y"]), [])
    subprocess.run([dlc, "grad", path, "--entry", f"{name}_loss", "--wrt", ",".join(wrt),
                    "--save-outputs", out] + files, check=True, capture_output=True)
    inputs = {p: np.load(os.path.join(data, "inputs", p + ".npy")).astype(np.float64) for p in params + ["y"]}
    model = jax_model(name)

    def loss(ws):
        args = [ws[p] if p in ws else inputs[p] for p in params]
        return ((model(*args) - inputs["y"]) ** 2).mean()
    grads = {p: np.asarray(g) for p, g in jax.grad(loss)({p: inputs[p] for p in wrt}).items()}
    # Each gradient's error relative to its largest magnitude, that at least
    # a thousandth of the model's largest: a gradient zero in real
    # arithmetic (W6's key bias, which the softmax cancels) is f32 rounding
    # noise in both, not a scale to measure against.
    top = max(np.abs(g).max() for g in grads.values())
    worst = 0.0
    for p in wrt:
        got = np.load(os.path.join(out, f"grad_{p}.npy")).astype(np.float64)
        scale = max(np.abs(grads[p]).max(), 1e-3 * top, 1e-30)
        worst = max(worst, float(np.abs(got - grads[p]).max() / scale))
    print(json.dumps({"grad_error_vs_jax": worst}))


def grad_cell(row):
    e = row["grad_error_vs_jax"]
    return "-" if e is None else f"{e:.1e}"


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        worker(sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5]), int(sys.argv[6]))
        return
    if len(sys.argv) > 1 and sys.argv[1] == "--grads":
        grad_check(sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5])
        return
    args, out, threads, only = arguments()
    rows = []
    compiles = {}
    names = [n for m in MODELS for n in [m] + [v for v, b in NARROW.items() if b == m]]
    for name in names:
        if only and name not in only:
            continue
        data = os.path.join(out, "train", name)
        os.makedirs(data, exist_ok=True)
        path = os.path.join(data, f"{name}.dl")
        open(path, "w").write(source(name))
        subprocess.run([args.dlc, "run", path, "--entry", f"{name}_step", "--random-inputs", "0",
                        "--save-inputs", os.path.join(data, "inputs")], check=True, capture_output=True)
        # In a process of its own: JAX's threads and memory stay out of the
        # peers' forked processes and their peak memory.
        error = None
        if name not in NARROW:
            o = subprocess.run([sys.executable, __file__, "--grads", args.dlc, name, path, data],
                               check=True, capture_output=True, text=True).stdout
            error = json.loads(o.strip().splitlines()[-1])["grad_error_vs_jax"]
        if not MODELS[base(name)][5]:
            rows.append({"model": name, "grad_error_vs_jax": error})
            print(json.dumps(rows[-1]), flush=True)
            continue
        # The step compiled from the cache: a second `dlc bench --cache`
        # in a cache of its own finds the whole program.
        cache_env = dict(os.environ, DLC_CACHE_DIR=os.path.join(data, "cache"))
        shutil.rmtree(cache_env["DLC_CACHE_DIR"], ignore_errors=True)
        for _ in range(2):
            o = subprocess.run([args.dlc, "bench", path, "--entry", f"{name}_step", "--runs", "1", "--warmup", "0",
                                "--cache", "--json"], check=True, capture_output=True, text=True, env=cache_env).stdout
        cached = json.loads(o)
        compiles[name] = {"cached_s": cached["compile_s"], "whole": cached.get("cached_program", False)}
        for t in threads:
            row = {"model": name, "threads": t, "grad_error_vs_jax": error}
            o, rss = run_measured([args.dlc, "bench", path, "--entry", f"{name}_step", "--threads", str(t),
                                   "--runs", str(args.runs), "--json"], t, dict(os.environ, OMP_NUM_THREADS=str(t)))
            d = json.loads(o)
            row["dlc"] = {"median_ms": d["median_ms"], "min_ms": d["min_ms"], "max_ms": d["max_ms"],
                          "compile_s": d.get("compile_s", d.get("compile_ms", 0) / 1e3), "peak_mib": rss}
            for peer in PEERS:
                try:
                    o, rss = run_measured([sys.executable, __file__, "--worker", peer, name, data, str(t), str(args.runs)],
                                          t, peer_env(t))
                    r = json.loads(o.strip().splitlines()[-1])
                    r["peak_mib"] = rss
                except RuntimeError as e:
                    print(f"{name} {t}t {peer}: {e}", file=sys.stderr)
                    r = {"failed": str(e)[-300:]}
                row[peer] = r
            rows.append(row)
            print(json.dumps(row), flush=True)
    with open(os.path.join(out, "train.json"), "w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
    cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
    lines = [f"# One training step (forward, backward, SGD update), {cpu}" + (f", DLC_CPU={CPU}" if CPU != "native" else ""), "",
             "median ms (min-max), peak memory; dlc / best = dlc's median over the best peer's", "",
             "| model | threads | dlc | PyTorch | torch.compile | JAX | dlc / best | dlc's gradients vs JAX's (relative) |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if "threads" not in r:
            continue
        cell = lambda p: "failed" if "failed" in r[p] else f"{r[p]['median_ms']:.2f} ({r[p]['min_ms']:.2f}-{r[p]['max_ms']:.2f}), {r[p]['peak_mib']:.0f} MiB"
        best = min((r[p]["median_ms"] for p in PEERS if "failed" not in r[p]), default=float("nan"))
        lines.append(f"| {r['model']} | {r['threads']} | {cell('dlc')} | {cell('pytorch')} | {cell('torch.compile')} | {cell('jax')} | "
                     f"{r['dlc']['median_ms'] / best:.2f} | {grad_cell(r)} |")
    # The bar: the geometric mean of the best peer's median over
    # dlc's, every model and thread count (f32 alone, and with the bf16
    # variants).
    def speedup(rs):
        ratios = []
        for r in rs:
            best = min((r[p]["median_ms"] for p in PEERS if "failed" not in r[p]), default=None)
            if best and "failed" not in r["dlc"]:
                ratios.append(best / r["dlc"]["median_ms"])
        return math.exp(sum(map(math.log, ratios)) / len(ratios)) if ratios else float("nan"), len(ratios)
    timed = [r for r in rows if "threads" in r]
    f32, n32 = speedup([r for r in timed if r["model"] not in NARROW])
    every, n = speedup(timed)
    lines += ["", f"Geometric mean of the best peer's median over dlc's: {f32:.2f}x over the {n32} f32 rows, "
              f"{every:.2f}x over all {n} rows (above 1: dlc is faster)."]
    # Compile times: dlc's cold (its fastest over the thread counts) and
    # from the cache; the peers' first call, compile included.
    lines += ["", "Compiling the step, s: dlc cold (`dlc bench`) and from the cache (a second `dlc bench --cache`); "
              "the peers' first call (compile and one step)", "",
              "| model | dlc cold | dlc from the cache | torch.compile | JAX |", "|---|---|---|---|---|"]
    for name, c in compiles.items():
        rs = [r for r in timed if r["model"] == name]
        first = lambda p: min((r[p]["compile_s"] for r in rs if "failed" not in r[p] and "compile_s" in r[p]),
                              default=float("nan"))
        cached = f"{c['cached_s']:.4f}" + ("" if c["whole"] else " (objects only)")
        lines.append(f"| {name} | {first('dlc'):.3f} | {cached} | {first('torch.compile'):.2f} | {first('jax'):.2f} |")
    untimed = [r for r in rows if "threads" not in r]
    if untimed:
        lines += ["", "Gradients of the losses only (not timed):", "",
                  "| model | grad error vs JAX |", "|---|---|"]
        lines += [f"| {r['model']} | {grad_cell(r)} |" for r in untimed]
    text = "\n".join(lines) + "\n"
    open(os.path.join(out, "train.md"), "w").write(text)
    print(text)


if __name__ == "__main__":
    main()
