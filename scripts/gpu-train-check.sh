#!/usr/bin/env bash
# The GPU training check: run on a machine with an NVIDIA GPU (its driver,
# NCCL, Python with PyTorch and NumPy; no Rust, LLVM, MPI or network needed),
# from the folder `make gpu-train-check-prepare` makes:
#
#   bash target/gpu-train-check/gpu-train-check.sh [REPORT_DIR]
#
# 1. trains the data-parallel tests' models (f32 SGD with momentum and
#    weight decay; bf16 Adam with running averages) on the CPU, on the GPU
#    (`--backend gpu`) and data-parallel on the GPU (`--data-parallel`, a
#    world of one whose gradients NCCL sums in three buckets), and compares
#    each GPU run's weights with the CPU's;
# 2. trains the digits classifier 20 epochs on the GPU (data-parallel) and
#    measures its accuracy on the test images, against the CPU's;
# 3. times W2's training step (128 rows, SGD) on the GPU, alone and
#    data-parallel, f32 and with bf16 products, against PyTorch eager's
#    same loop (batches copied in each step, `optimizer.step()`), steps/s.
# Writes report.md, train.log and the runs' JSON lines into REPORT_DIR
# (default $OUT, else ./report); its status is 1 if any comparison fails.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
report=${1:-${OUT:-$here/report}}
mkdir -p "$report"
exec > >(tee "$report/train.log") 2>&1
work=$(mktemp -d)
start=$SECONDS
status=0

nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
python3 -c 'import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2], "wb"))' \
    "$here/dlc.xz" "$work/dlc"
chmod +x "$work/dlc"
dlc=$work/dlc
if ldd "$dlc" | grep -q "not found"; then
    echo "dlc cannot start here:"; ldd "$dlc" | grep "not found"; exit 1
fi
# PyTorch's NCCL wheel holds libnccl.so.2 only; cudarc loads libnccl.so.
nccl=$(python3 -c 'import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], "lib"))' 2>/dev/null || true)
if [ -n "$nccl" ] && [ -e "$nccl/libnccl.so.2" ]; then
    mkdir -p "$work/nccl" && ln -sf "$nccl/libnccl.so.2" "$work/nccl/libnccl.so"
    export LD_LIBRARY_PATH=$work/nccl:${LD_LIBRARY_PATH:-}
fi
export DLC_CACHE_DIR=$work/cache
"$dlc" --version

cd "$work"
python3 - <<'PY'
import numpy as np
x = np.array([((i * 37 % 23) - 11.0) / 8.0 for i in range(12 * 4)], np.float32).reshape(12, 4)
y = np.array([((i * 11 % 7) - 3.0) / 4.0 for i in range(12 * 2)], np.float32).reshape(12, 2)
np.save("x.npy", x); np.save("y.npy", y)
r = np.random.default_rng(0)
np.save("w2x.npy", r.uniform(-1, 1, (2048, 1024)).astype(np.float32))
np.save("w2y.npy", r.uniform(-1, 1, (2048, 1024)).astype(np.float32))
PY

echo "== 1. the tests' models: the GPU's weights against the CPU's"
: > "$report/compare.txt"
for entry in loss loss_bn; do
    if [ $entry = loss ]; then
        opts="--data y=y.npy --optimizer sgd --momentum 0.9 --weight-decay 0.01 --lr 0.05"
    else
        opts="--optimizer adam --precision bf16"
    fi
    for how in cpu gpu gpu-dp; do
        case $how in
            cpu) extra="" ;;
            gpu) extra="--backend gpu" ;;
            gpu-dp) extra="--backend gpu --data-parallel --bucket-mb 0.0001" ;;
        esac
        # shellcheck disable=SC2086
        if ! "$dlc" train "$here/mlp.dl" --entry $entry --data x=x.npy $opts --epochs 3 \
            --save-weights "$entry-$how.safetensors" $extra > "$entry-$how.out" 2>&1; then
            echo "FAIL $entry $how: $(tail -1 "$entry-$how.out")" | tee -a "$report/compare.txt"
            status=1
        fi
        tail -2 "$entry-$how.out"
    done
done
python3 - "$report/compare.txt" <<'PY' || status=1
import json, struct, sys
import numpy as np
def load(f):
    b = open(f, "rb").read(); n = struct.unpack("<Q", b[:8])[0]
    h = json.loads(b[8:8 + n]); d = b[8 + n:]
    return {k: np.frombuffer(d[v["data_offsets"][0]:v["data_offsets"][1]], np.float32)
            for k, v in h.items() if k != "__metadata__"}
bad = 0
with open(sys.argv[1], "a") as out:
    for entry in ["loss", "loss_bn"]:
        try:
            ref = load(f"{entry}-cpu.safetensors")
        except OSError:
            continue
        for how in ["gpu", "gpu-dp"]:
            try:
                got = load(f"{entry}-{how}.safetensors")
            except OSError:
                continue
            for k, r in ref.items():
                err = float(np.abs(got[k] - r).max()); scale = max(float(np.abs(r).max()), 1.0)
                ok = err <= 1e-5 * scale
                bad += not ok
                line = f"{'ok' if ok else 'FAIL'} {entry} {how} {k}: largest difference {err:.3e} (scale {scale:.3g})"
                print(line); out.write(line + "\n")
sys.exit(1 if bad else 0)
PY

echo "== 2. the digits classifier, 20 epochs"
for how in cpu gpu-dp; do
    extra=""; [ $how = gpu-dp ] && extra="--backend gpu --data-parallel"
    # shellcheck disable=SC2086
    "$dlc" train "$here/digits_mlp.dl" --entry loss --data x="$here/data/digits_train_x.npy" \
        --data y="$here/data/digits_train_y.npy" --epochs 20 --optimizer adam --lr 0.001 \
        --save-weights "digits-$how" $extra | tail -2 || status=1
    "$dlc" run "$here/digits_mlp.dl" --entry accuracy --weights "digits-$how" \
        --input x="$here/data/digits_test_x.npy" --input y="$here/data/digits_test_y.npy" \
        | sed "s/^/$how accuracy: /" | tee -a "$report/compare.txt" || status=1
done

echo "== 3. W2's training step: steps/s"
: > "$report/w2.jsonl"
for how in gpu gpu-dp gpu-bf16 gpu-dp-bf16; do
    extra="--backend gpu"
    case $how in *dp*) extra="$extra --data-parallel" ;; esac
    case $how in *bf16) extra="$extra --precision bf16" ;; esac
    # shellcheck disable=SC2086
    timeout 120 "$dlc" train "$here/w2_train.dl" --data x=w2x.npy --data y=w2y.npy --epochs 4 \
        --lr 0.01 --json $extra 2> "w2-$how.err" | sed "s/^{/{\"run\": \"$how\", /" | tee -a "$report/w2.jsonl" \
        || { echo "FAIL w2 $how: $(tail -1 "w2-$how.err")"; status=1; }
done
PYTHONUNBUFFERED=1 timeout 120 python3 - "$report/w2.jsonl" <<'PY' || status=1
import json, sys, time
import numpy as np, torch
x = torch.from_numpy(np.load("w2x.npy")); y = torch.from_numpy(np.load("w2y.npy"))
dev = "cuda"
for precision in ["f32", "bf16"]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.ReLU(), torch.nn.Linear(4096, 1024)).to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for epoch in range(1, 5):
        perm = torch.randperm(2048)
        torch.cuda.synchronize(); t = time.perf_counter(); total = 0.0
        for b in range(16):
            idx = perm[b * 128:(b + 1) * 128]
            xb, yb = x[idx].to(dev), y[idx].to(dev)
            with torch.autocast(dev, dtype=torch.bfloat16, enabled=precision == "bf16"):
                loss = torch.nn.functional.mse_loss(model(xb).float(), yb)
            opt.zero_grad(set_to_none=True); loss.backward(); opt.step()
            total += loss.item()
        torch.cuda.synchronize()
        line = {"run": f"torch-eager-{precision}", "epoch": epoch, "loss": total / 16,
                "steps_per_s": 16 / (time.perf_counter() - t)}
        print(json.dumps(line))
        open(sys.argv[1], "a").write(json.dumps(line) + "\n")
PY

python3 - "$report" <<'PY'
import json, sys, statistics
rep = sys.argv[1]
rows = [json.loads(l) for l in open(f"{rep}/w2.jsonl") if l.strip()]
runs = {}
for r in rows:
    if r.get("epoch", 0) >= 2:  # the first epoch warms up
        runs.setdefault(r["run"], []).append(r["steps_per_s"])
lines = ["# GPU training check", "", "## Weights against the CPU's", "", "```"]
lines += [l.rstrip() for l in open(f"{rep}/compare.txt")]
lines += ["```", "", "## W2's training step (128 rows, SGD), epochs 2-4", "",
          "| run | steps/s (median) | min | max |", "|---|---|---|---|"]
for k, v in runs.items():
    lines.append(f"| {k} | {statistics.median(v):.1f} | {min(v):.1f} | {max(v):.1f} |")
open(f"{rep}/report.md", "w").write("\n".join(lines) + "\n")
print("\n".join(lines))
PY
echo "done in $((SECONDS - start)) s (status $status)"
exit $status
