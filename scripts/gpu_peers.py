#!/usr/bin/env python3
"""W1..W8 in PyTorch on GPU 0, timed as `dlc-rt bench` times dlc's modules.

Usage: gpu_peers.py OUT.json [--runs N] [--compile-budget SECONDS]

Runs in the GPU check (scripts/gpu-check.sh), on the machine with the GPU.
Each workload of examples/w*.dl, in PyTorch (torch_workloads.py, layernorm
as torch's fused one), it runs eagerly and under torch.compile (the
default mode), and the median of RUNS calls after warm-up is taken, each
call waited for (torch.cuda.synchronize), as dlc-rt waits for each of its
calls. Also: W1 on cuBLAS in f32 (no TF32), in TF32 and in bf16, W4 as
torch's fused attention (scaled_dot_product_attention), the rows the GPU
bar names, and W2's training step (mean squared error, backward, SGD at
0.01 returning new weights, as dlc's `w2_step` does) in f32 and under
torch.autocast to bf16 (`w2_step_bf16`). torch.compile stops being tried once its compiles have taken
--compile-budget seconds in all, so that the check ends in time; the
skipped rows say so. Writes one JSON object per line to OUT.json.
"""
import json
import math
import os
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_workloads  # noqa: E402

# GPU_PEERS_DEVICE=cpu runs the script on a machine without a GPU (a
# check of the script itself; its times mean nothing for the GPU bar).
DEVICE = os.environ.get("GPU_PEERS_DEVICE", "cuda")


def sync():
    if DEVICE == "cuda":
        torch.cuda.synchronize()


def rand(*shape, positive=False, scale=1.0):
    t = torch.rand(*shape, device=DEVICE) * 2 - 1
    if positive:
        t = t.abs() + 0.25
    return t * scale


def workloads():
    """(entry, function, maker of its inputs) for W1..W8."""
    w = torch_workloads.models(torch, layernorm=lambda z: F.layer_norm(z, z.shape[-1:], eps=1e-5))

    def conv_args(n):
        per = lambda: [rand(64), rand(64, positive=True), rand(64), rand(64)]
        return [rand(n, 64, 56, 56), rand(64, 64, 3, 3, scale=1 / 24), *per(),
                rand(64, 64, 3, 3, scale=1 / 24), *per()]

    def bert_args():
        lin = lambda i, o: [rand(i, o, scale=1 / math.sqrt(i)), rand(o)]
        return [rand(128, 768), *lin(768, 768), *lin(768, 768), *lin(768, 768), *lin(768, 768),
                rand(768), rand(768), *lin(768, 3072), *lin(3072, 768), rand(768), rand(768)]

    return [
        ("gemm_1024", w["gemm"], lambda: [rand(1024, 1024), rand(1024, 1024)]),
        ("gemm_2048", w["gemm"], lambda: [rand(2048, 2048), rand(2048, 2048)]),
        ("mlp", w["mlp"], lambda: [rand(128, 1024), rand(1024, 4096, scale=1 / 32), rand(4096),
                                   rand(4096, 1024, scale=1 / 64), rand(1024)]),
        ("conv_block_b1", w["conv_block"], lambda: conv_args(1)),
        ("conv_block_b8", w["conv_block"], lambda: conv_args(8)),
        ("attention", w["attention"], lambda: [rand(12, 384, 64), rand(12, 384, 64), rand(12, 384, 64)]),
        ("layernorm_gelu", w["layernorm_gelu"], lambda: [rand(2048, 768), rand(768), rand(768)]),
        ("bert_layer", w["bert_layer"], bert_args),
        ("gru", w["gru"], lambda: [rand(32, 64, 256), rand(1536, 256, scale=1 / 16),
                                   rand(1536, 512, scale=1 / math.sqrt(512)), rand(1536), rand(1536)]),
        ("gcn", w["gcn"], lambda: [rand(2708, 2708, scale=1 / 52), rand(2708, 1433),
                                   rand(1433, 16, scale=1 / math.sqrt(1433)), rand(16, 7, scale=0.25)]),
    ]


def w2_steps(mlp):
    """(entry, step, maker of its inputs): W2's training step in f32 and
    with bf16 autocast, taking (x, y, w1, b1, w2, b2)."""
    def step(narrow):
        def run(x, y, w1, b1, w2, b2):
            ws = [w1, b1, w2, b2]
            with torch.autocast(DEVICE, dtype=torch.bfloat16, enabled=narrow):
                out = mlp(x, *ws)
            loss = F.mse_loss(out.float(), y)
            grads = torch.autograd.grad(loss, ws)
            with torch.no_grad():
                return loss, [w - 0.01 * g for w, g in zip(ws, grads)]
        return run

    def args():
        ws = [rand(1024, 4096, scale=1 / 32), rand(4096), rand(4096, 1024, scale=1 / 64), rand(1024)]
        return [rand(128, 1024), rand(128, 1024)] + [w.requires_grad_() for w in ws]

    return [("w2_step", step(False), args), ("w2_step_bf16", step(True), args)]


def time_calls(call, runs, warmup=3, grad=False):
    """Median, min and max milliseconds of `runs` calls, each waited for
    (with autograd enabled when `grad`)."""
    with torch.set_grad_enabled(grad):
        for _ in range(warmup):
            call()
        sync()
        ms = []
        for _ in range(runs):
            t = time.perf_counter()
            call()
            sync()
            ms.append((time.perf_counter() - t) * 1e3)
    ms.sort()
    return ms[len(ms) // 2], ms[0], ms[-1]


def main():
    out = sys.argv[1]
    runs = int(sys.argv[sys.argv.index("--runs") + 1]) if "--runs" in sys.argv else 50
    budget = (float(sys.argv[sys.argv.index("--compile-budget") + 1])
              if "--compile-budget" in sys.argv else 240.0)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    device = torch.cuda.get_device_name(0) if DEVICE == "cuda" else "cpu"
    rows = []

    def row(entry, peer, timing, **extra):
        r = {"entry": entry, "peer": peer, "device": device}
        if timing is not None:
            r.update(median_ms=timing[0], min_ms=timing[1], max_ms=timing[2], runs=runs)
        r.update(extra)
        rows.append(r)
        print(json.dumps(r), flush=True)

    spent = 0.0
    mlp = torch_workloads.models(torch)["mlp"]
    cases = [(e, f, m, False) for e, f, m in workloads()] + [(e, f, m, True) for e, f, m in w2_steps(mlp)]
    for entry, f, make, grad in cases:
        args = make()
        row(entry, "torch-eager", time_calls(lambda: f(*args), runs, grad=grad))
        if spent > budget:
            row(entry, "torch-compile", None, skipped=f"torch.compile budget of {budget:.0f} s spent")
            continue
        t = time.perf_counter()
        try:
            g = torch.compile(f)
            with torch.set_grad_enabled(grad):
                g(*args)
            sync()
            compile_s = time.perf_counter() - t
            row(entry, "torch-compile", time_calls(lambda: g(*args), runs, grad=grad), compile_s=compile_s)
        except Exception as e:  # a compile failure is a row, not the end of the check
            row(entry, "torch-compile", None, error=str(e).splitlines()[0][:200])
        spent += time.perf_counter() - t

    for n in (1024, 2048, 4096) if DEVICE == "cuda" else (256,):
        a, b = rand(n, n), rand(n, n)
        flop = 2 * n**3
        for name, dtype, tf32 in (("cublas-f32", torch.float32, False),
                                  ("cublas-tf32", torch.float32, True),
                                  ("cublas-bf16", torch.bfloat16, False)):
            torch.backends.cuda.matmul.allow_tf32 = tf32
            x, y = a.to(dtype), b.to(dtype)
            timing = time_calls(lambda: x @ y, runs)
            row(f"gemm_{n}", name, timing, tflops=flop / timing[0] / 1e9)
        torch.backends.cuda.matmul.allow_tf32 = False
    q, k, v = rand(1, 12, 384, 64), rand(1, 12, 384, 64), rand(1, 12, 384, 64)
    row("attention", "torch-sdpa-f32", time_calls(lambda: F.scaled_dot_product_attention(q, k, v), runs))
    qh, kh, vh = q.half(), k.half(), v.half()
    row("attention", "torch-sdpa-f16", time_calls(lambda: F.scaled_dot_product_attention(qh, kh, vh), runs))

    with open(out, "w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")


if __name__ == "__main__":
    main()
