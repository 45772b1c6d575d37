#!/usr/bin/env python3
"""Data-parallel training steps on this machine: `dlc train --ranks N` (Open
MPI) against PyTorch's DistributedDataParallel on the gloo backend, W2's and
W6's models made into mean-squared-error losses (bench_train.py's), plain
SGD at 0.01, each rank one core and its own batch (the workload's: 128 rows
a rank, so the global batch grows with the ranks).

Usage: bench_distributed.py DLC OUT [--ranks "1 2"] [--steps N] [--only NAME,...]

For each model and number of ranks: dlc's steps per second (median of the
epochs after the first, N steps each) with its gradient in stages (25 MiB
buckets, each summed as its stage ends) and with one bucket summed after
the whole gradient (`--bucket-mb 100000`), the share of the step spent in
MPI calls, and how much of the one-bucket step's communication the stages
hide; the step alone (`dlc train` without ranks: one compiled call);
PyTorch DDP's steps per second, and the part of its step that communication
adds (its step against the same step under `no_sync()`, which skips the
all-reduce DDP overlaps with the backward pass). Writes
OUT/distributed.json and OUT/distributed.md.
"""
import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_train  # noqa: E402

MODELS = ["w2_mlp", "w6_bert_layer"]
LR = 0.01
EPOCHS = 4


def shape(ty):
    return [int(d) for d in ty[ty.index("[") + 1:-1].split(",")]


def prepare(name, out, ranks, steps):
    """The dlc loss program and the data (steps x ranks x batch rows)."""
    import numpy as np
    _, entry, params, out_shape, _, _ = bench_train.MODELS[name]
    text, types = bench_train.program(name)
    x, weights = params[0], params[1:]
    y_ty = "f32[" + ", ".join(map(str, out_shape)) + "]"
    decl = ", ".join([f"{x}: {types[x]}", f"y: {y_ty}"] + [f"weight {w}: {types[w]}" for w in weights])
    path = os.path.join(out, f"{name}.dl")
    with open(path, "w") as f:
        f.write(text + f"\nfn loss({decl}) -> f32 {{\n    return mse_loss({entry}({', '.join(params)}), y);\n}}\n")
    rng = np.random.default_rng(0)
    rows = steps * ranks * shape(types[x])[0]
    files = {}
    for n, s in ((x, shape(types[x])), ("y", out_shape)):
        files[n] = os.path.join(out, f"{name}_{n}_{ranks}.npy")
        np.save(files[n], rng.standard_normal([rows] + list(s[1:]), dtype=np.float32))
    # The weights: drawn once, the same for both (uniform within
    # 1/sqrt(fan-in) as dlc train and PyTorch's layers draw them).
    wdir = os.path.join(out, f"{name}_weights")
    os.makedirs(wdir, exist_ok=True)
    for w in weights:
        s = shape(types[w])
        bound = 1 / (s[0] ** 0.5) if len(s) >= 2 else 0.0
        np.save(os.path.join(wdir, f"{w}.npy"),
                (rng.uniform(-bound, bound, s) if len(s) >= 2 else np.ones(s) if w.startswith("g") else np.zeros(s))
                .astype(np.float32))
    return path, files, wdir


def run_dlc(dlc, path, files, wdir, ranks, extra=()):
    cmd = [dlc, "train", path, "--entry", "loss", "--epochs", str(EPOCHS), "--lr", str(LR), "--json",
           "--weights", wdir] + sum((["--data", f"{n}={p}"] for n, p in files.items()), []) + list(extra)
    if ranks:
        cmd += ["--ranks", str(ranks)]
    env = dict(os.environ, OMP_NUM_THREADS="1", OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    start = time.perf_counter()
    o = subprocess.run(cmd, check=True, capture_output=True, text=True, env=env)
    wall = time.perf_counter() - start
    lines = [json.loads(l) for l in o.stdout.splitlines() if l.startswith("{")][1:]
    rates = [l["steps_per_s"] for l in lines]
    r = {"steps_per_s": statistics.median(rates), "min": min(rates), "max": max(rates), "wall_s": wall}
    if ranks:
        c = sum(l["compute_s"] for l in lines)
        a = sum(l["allreduce_s"] for l in lines)
        r.update(allreduce_share=a / (a + c), allreduce_bytes=lines[-1]["allreduce_bytes"],
                 buckets=lines[-1]["buckets"])
    return r


def ddp_worker(name, rank, world, port, out, steps):
    import numpy as np
    import torch
    import torch.distributed as dist
    os.sched_setaffinity(0, {rank % os.cpu_count()})
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    _, _, params, _, _, _ = bench_train.MODELS[name]
    fn = bench_train.torch_models(torch)[name]
    wdir = os.path.join(out, f"{name}_weights")

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.ws = torch.nn.ParameterList(
                [torch.nn.Parameter(torch.from_numpy(np.load(os.path.join(wdir, f"{w}.npy")))) for w in params[1:]])

        def forward(self, x):
            return fn(x, *self.ws)

    model = torch.nn.parallel.DistributedDataParallel(Model())
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    x = torch.from_numpy(np.load(os.path.join(out, f"{name}_{params[0]}_{world}.npy")))
    y = torch.from_numpy(np.load(os.path.join(out, f"{name}_y_{world}.npy")))
    b = x.shape[0] // (steps * world)

    def step(i):
        rows = slice((i % steps * world + rank) * b, (i % steps * world + rank + 1) * b)
        opt.zero_grad(set_to_none=True)
        loss = ((model(x[rows]) - y[rows]) ** 2).mean()
        loss.backward()
        opt.step()

    def timed(sync):
        rates = []
        for e in range(EPOCHS):
            dist.barrier()
            start = time.perf_counter()
            for i in range(steps):
                if sync:
                    step(i)
                else:
                    with model.no_sync():
                        step(i)
            rates.append(steps / (time.perf_counter() - start))
        return rates[1:]
    synced = timed(True)
    alone = timed(False)
    if rank == 0:
        s, n = statistics.median(synced), statistics.median(alone)
        print(json.dumps({"steps_per_s": s, "min": min(synced), "max": max(synced),
                          "comm_share": max(0.0, 1 / s - 1 / n) * s}))
    dist.destroy_process_group()


def run_ddp(name, out, ranks, steps):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = [subprocess.Popen([sys.executable, __file__, "--ddp-worker", name, str(r), str(ranks), str(port), out,
                               str(steps)], stdout=subprocess.PIPE, text=True,
                              env=dict(os.environ, OMP_NUM_THREADS="1"))
             for r in range(ranks)]
    outs = [p.communicate()[0] for p in procs]
    if any(p.returncode for p in procs):
        raise SystemExit(f"DDP {name} on {ranks} rank(s) failed")
    return json.loads(outs[0].strip().splitlines()[-1])


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "--ddp-worker":
        a = sys.argv[2:]
        ddp_worker(a[0], int(a[1]), int(a[2]), int(a[3]), a[4], int(a[5]))
        return
    p = argparse.ArgumentParser()
    p.add_argument("dlc")
    p.add_argument("out")
    p.add_argument("--ranks", default="1 2")
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--only", default="")
    args = p.parse_args()
    out = os.path.join(args.out, "distributed")
    os.makedirs(out, exist_ok=True)
    rows = []
    for name in MODELS:
        if args.only and name not in args.only.split(","):
            continue
        for ranks in [int(r) for r in args.ranks.split()]:
            path, files, wdir = prepare(name, out, ranks, args.steps)
            row = {"model": name, "ranks": ranks, "dlc": run_dlc(args.dlc, path, files, wdir, ranks),
                   "dlc_one_bucket": run_dlc(args.dlc, path, files, wdir, ranks, ["--bucket-mb", "100000"]),
                   "ddp": run_ddp(name, out, ranks, args.steps)}
            if ranks == 1:
                row["dlc_alone"] = run_dlc(args.dlc, path, files, wdir, None)
            rows.append(row)
            print(json.dumps(row), flush=True)
    with open(os.path.join(args.out, "distributed.json"), "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)
    cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
    lines = [f"# Data-parallel training steps, {cpu}, one core a rank", "",
             "steps/s, median (min-max) of epochs 2-4. dlc: its gradient in stages, a bucket's all-reduce started "
             "as its stage ends (25 MiB buckets), and in one stage with one bucket summed after it; in MPI: the share "
             "of dlc's step spent in MPI calls; hidden: the part of the one-bucket step's communication (its step "
             "over one rank's) that the stages remove. DDP communication: what its step costs over the same step "
             "under `no_sync()` (DDP overlaps its all-reduce with the backward pass)", "",
             "| model | ranks | dlc | in MPI | dlc, one bucket | hidden | PyTorch DDP (gloo) | DDP communication "
             "| dlc / DDP |",
             "|---|---|---|---|---|---|---|---|---|"]
    def cell(v):
        return f"{v['steps_per_s']:.1f} ({v['min']:.1f}-{v['max']:.1f})"
    base = {r["model"]: r["dlc"]["steps_per_s"] for r in rows if r["ranks"] == 1}
    for r in rows:
        d, o, t = r["dlc"], r["dlc_one_bucket"], r["ddp"]
        one = base.get(r["model"])
        hidden = "-"
        if one and r["ranks"] > 1:
            cost = 1 / o["steps_per_s"] - 1 / one
            hidden = f"{100 * (1 / o['steps_per_s'] - 1 / d['steps_per_s']) / cost:.0f}%" if cost > 0 else "-"
        lines.append(f"| {r['model']} | {r['ranks']} | {cell(d)} | {100 * d['allreduce_share']:.1f}% of "
                     f"{d['allreduce_bytes'] / 2**20:.1f} MiB, {d['buckets']} bucket(s) | {cell(o)} | {hidden} | "
                     f"{cell(t)} | {100 * t['comm_share']:.1f}% | {d['steps_per_s'] / t['steps_per_s']:.2f}x |")
    lines += ["", "One rank without MPI (`dlc train`, the step as one compiled call): " + ", ".join(
        f"{r['model']} {cell(r['dlc_alone'])}" for r in rows if "dlc_alone" in r)]
    open(os.path.join(args.out, "distributed.md"), "w").write("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
