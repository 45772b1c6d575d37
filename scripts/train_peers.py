#!/usr/bin/env python3
"""The digits classifiers of examples/train trained by dlc and by PyTorch from
the same initial weights, with the same batch size, optimizer and
hyperparameters, then measured on the same test images.

Usage: train_peers.py DLC OUT [--epochs N] [--seed S]

For each model (digits_mlp.dl with Adam, digits_cnn.dl with SGD and momentum):
- initial weights are drawn once (uniform within +-1/sqrt(fan-in) for weights,
  zero for biases: what `dlc train` draws, the bound PyTorch's layers use) and
  written as OUT/init-MODEL/NAME.npy;
- `dlc train --weights` trains from them (one thread), `dlc run --entry
  accuracy --weights` measures the result;
- PyTorch (eager, one thread) trains the same function of the same weights:
  shuffled batches of 32 (its own shuffle), the last partial batch dropped,
  torch.optim.Adam / SGD(momentum=0.9);
- the test accuracies and training throughputs (steps per second over the
  whole run, compile excluded for dlc: its own per-epoch rates) are reported.
Writes OUT/train-peers.md and OUT/train-peers.json.
"""
import json
import os
import subprocess
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
DATA = os.path.join(ROOT, "examples", "train", "data")


def load(name):
    return np.load(os.path.join(DATA, name))


def mlp(x, p):
    h = torch.relu((x.float() / 16.0) @ p["w1"] + p["b1"])
    return h @ p["w2"] + p["b2"]


def cnn(x, p):
    img = (x.float() / 16.0).reshape(-1, 1, 8, 8)
    h = F.max_pool2d(torch.relu(F.conv2d(img, p["w1"], padding=1) + p["b1"].reshape(1, 8, 1, 1)), 2, 2)
    h = F.max_pool2d(torch.relu(F.conv2d(h, p["w2"], padding=1) + p["b2"].reshape(1, 16, 1, 1)), 2, 2)
    return h.reshape(-1, 64) @ p["w3"] + p["b3"]


MODELS = {
    "mlp": {
        "file": "digits_mlp.dl",
        "fn": mlp,
        "shapes": {"w1": (64, 64), "b1": (64,), "w2": (64, 10), "b2": (10,)},
        "fan_in": {"w1": 64, "w2": 64},
        "dlc": ["--optimizer", "adam", "--lr", "0.001"],
        "torch": lambda ps: torch.optim.Adam(ps, lr=0.001),
    },
    "cnn": {
        "file": "digits_cnn.dl",
        "fn": cnn,
        "shapes": {"w1": (8, 1, 3, 3), "b1": (8,), "w2": (16, 8, 3, 3), "b2": (16,), "w3": (64, 10), "b3": (10,)},
        "fan_in": {"w1": 9, "w2": 72, "w3": 64},
        "dlc": ["--optimizer", "sgd", "--momentum", "0.9", "--lr", "0.05"],
        "torch": lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.9),
    },
}


def init(model, seed, out):
    rng = np.random.default_rng(seed)
    os.makedirs(out, exist_ok=True)
    weights = {}
    for name, shape in model["shapes"].items():
        if len(shape) == 1:
            w = np.zeros(shape, np.float32)
        else:
            bound = 1.0 / np.sqrt(model["fan_in"][name])
            w = rng.uniform(-bound, bound, shape).astype(np.float32)
        np.save(os.path.join(out, name + ".npy"), w)
        weights[name] = w
    return weights


def run_dlc(dlc, model, epochs, seed, init_dir, out_dir):
    path = os.path.join(ROOT, "examples", "train", model["file"])
    env = dict(os.environ, OMP_NUM_THREADS="1")
    args = [dlc, "train", path, "--entry", "loss",
            "--data", "x=" + os.path.join(DATA, "digits_train_x.npy"),
            "--data", "y=" + os.path.join(DATA, "digits_train_y.npy"),
            "--epochs", str(epochs), "--seed", str(seed), "--json",
            "--weights", init_dir, "--save-weights", out_dir] + model["dlc"]
    start = time.perf_counter()
    log = subprocess.run(args, env=env, check=True, capture_output=True, text=True).stdout
    wall = time.perf_counter() - start
    epochs_log = [json.loads(line) for line in log.splitlines() if line.startswith("{")]
    rates = [e["steps_per_s"] for e in epochs_log]
    acc_out = os.path.join(out_dir, "acc")
    subprocess.run([dlc, "run", path, "--entry", "accuracy", "--weights", out_dir,
                    "--input", "x=" + os.path.join(DATA, "digits_test_x.npy"),
                    "--input", "y=" + os.path.join(DATA, "digits_test_y.npy"),
                    "--save-outputs", acc_out], env=env, check=True, capture_output=True)
    acc = float(np.load(os.path.join(acc_out, "out0.npy")))
    return {"accuracy": acc, "final_loss": epochs_log[-1]["loss"],
            "steps_per_s": float(np.median(rates)), "wall_s": wall}


def run_torch(model, weights, epochs, seed):
    torch.set_num_threads(1)
    torch.manual_seed(seed)
    x = torch.from_numpy(load("digits_train_x.npy").astype(np.int64))
    y = torch.from_numpy(load("digits_train_y.npy"))
    p = {k: torch.tensor(v, requires_grad=True) for k, v in weights.items()}
    opt = model["torch"](list(p.values()))
    n, batch = x.shape[0], 32
    steps = 0
    start = time.perf_counter()
    for _ in range(epochs):
        order = torch.randperm(n)
        total = 0.0
        for b in range(n // batch):
            idx = order[b * batch:(b + 1) * batch]
            loss = F.cross_entropy(model["fn"](x[idx], p), y[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
            total += loss.item()
            steps += 1
    seconds = time.perf_counter() - start
    with torch.no_grad():
        xt = torch.from_numpy(load("digits_test_x.npy").astype(np.int64))
        yt = torch.from_numpy(load("digits_test_y.npy"))
        acc = (model["fn"](xt, p).argmax(1) == yt).float().mean().item()
    return {"accuracy": acc, "final_loss": total / (n // batch), "steps_per_s": steps / seconds}


def main():
    dlc, out = sys.argv[1], sys.argv[2]
    epochs = int(sys.argv[sys.argv.index("--epochs") + 1]) if "--epochs" in sys.argv else 20
    seed = int(sys.argv[sys.argv.index("--seed") + 1]) if "--seed" in sys.argv else 0
    os.makedirs(out, exist_ok=True)
    rows = []
    for name, model in MODELS.items():
        init_dir = os.path.join(out, "init-" + name)
        weights = init(model, seed, init_dir)
        d = run_dlc(dlc, model, epochs, seed, init_dir, os.path.join(out, "trained-" + name))
        t = run_torch(model, weights, epochs, seed)
        rows.append({"model": name, "epochs": epochs, "dlc": d, "pytorch": t})
    with open(os.path.join(out, "train-peers.json"), "w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
    cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
    lines = [f"# Digits classifiers: dlc train against PyTorch (eager), one thread, {cpu}", "",
             "| model | epochs | dlc test accuracy | PyTorch test accuracy | dlc final loss | PyTorch final loss | dlc steps/s | PyTorch steps/s |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        d, t = r["dlc"], r["pytorch"]
        lines.append(f"| {r['model']} | {r['epochs']} | {d['accuracy']:.4f} | {t['accuracy']:.4f} | {d['final_loss']:.4f} | {t['final_loss']:.4f} | {d['steps_per_s']:.0f} | {t['steps_per_s']:.0f} |")
    text = "\n".join(lines) + "\n"
    with open(os.path.join(out, "train-peers.md"), "w") as f:
        f.write(text)
    print(text)


if __name__ == "__main__":
    main()
