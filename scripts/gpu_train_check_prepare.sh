#!/usr/bin/env bash
# `make gpu-train-check-prepare`: the GPU training check, made here (no GPU
# needed) into target/gpu-train-check/, which travels to a machine with an
# NVIDIA GPU, its driver, NCCL and Python with PyTorch, but no Rust, no
# LLVM, no MPI and no network:
#   dlc.xz                 the compiler, built without MPI (a world of one
#                          there: NCCL sums its gradients), stripped, xz'd
#   gpu-train-check.sh     the check itself (scripts/gpu-train-check.sh)
#   mlp.dl, w2_train.dl    the models it trains; digits_mlp.dl and its data
# It stops with an error if the folder reaches 56 MiB (the machine takes
# 64 MiB with the repository).
set -euo pipefail
cd "$(dirname "$0")/.."
out=target/gpu-train-check
limit=$((56 << 20))
rm -rf "$out"
mkdir -p "$out/data"
cargo build --release --locked -p dlc --no-default-features
strip -o "$out/dlc" target/release/dlc
# Put back the dlc with MPI that the other targets run.
cargo build --release --locked -p dlc
xz -T2 -6 "$out/dlc"
cp scripts/gpu-train-check.sh examples/train/digits_mlp.dl "$out/"
cp examples/train/data/*.npy "$out/data/"
# The data-parallel tests' models (tools/dlc/tests/distributed.rs).
cat > "$out/mlp.dl" <<'DL'
fn loss(x: f32[6, 4], y: f32[6, 2], weight w1: f32[4, 8], weight b1: f32[8],
        weight w2: f32[8, 2]) -> f32 {
    let p = tanh(x @ w1 + b1) @ w2;
    return mean((p - y) * (p - y));
}
fn loss_bn(x: f32[6, 4], weight w: f32[4, 3], weight gamma: f32[3], weight beta: f32[3],
           mean: f32[3], var: f32[3]) -> (f32, f32[3], f32[3]) {
    let (h, m, v) = batchnorm_train(x @ w, gamma, beta, mean, var);
    return (mean(h * h), m, v);
}
DL
# W2 (bench/WORKLOADS.md's MLP) as a regression to train: 128 rows a step.
cat > "$out/w2_train.dl" <<'DL'
fn loss(x: f32[128, 1024], y: f32[128, 1024], weight w1: f32[1024, 4096], weight b1: f32[4096],
        weight w2: f32[4096, 1024], weight b2: f32[1024]) -> f32 {
    return mse_loss(relu(x @ w1 + b1) @ w2 + b2, y);
}
DL
size=$(du -sb "$out" | cut -f1)
echo "$out: $((size >> 20)) MiB"
if [ "$size" -ge "$limit" ]; then
    echo "error: $out is $((size >> 20)) MiB, over the 56 MiB that may travel" >&2
    exit 1
fi
