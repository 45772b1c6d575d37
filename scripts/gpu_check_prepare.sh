#!/usr/bin/env bash
# `make gpu-check-prepare`: everything the GPU check needs, made here (no GPU
# needed) into target/gpu-check/, which travels to a machine with a GPU but
# no Rust, no LLVM and no network:
#   dlc-rt                 the runner (the runtime crate alone, no LLVM)
#   gpu-check.sh           the check itself (scripts/gpu-check.sh)
#   gpu-profile.sh         where the time goes (scripts/gpu-profile.sh)
#   gpu_peers.py           W1..W8 in PyTorch (scripts/gpu_peers.py, torch_workloads.py)
#   modules/NAME.dlcm      every workload (W1..W8 at full size; W1 also with
#                          TF32 products and in bf16), every differential
#                          program, the narrow-float and tensor-core cases,
#                          W2's training step in f32 and with bf16 products
#                          (a quarter as wide, checked; full size, timed),
#                          compiled for sm_90 (`--emit gpu-module`)
#   ref/NAME/ENTRY/outI.npy  the graph interpreter's results on the inputs
#                          `--random-inputs 0` draws (dlc-rt draws the same);
#                          a variant NAME_tf32 is checked against NAME's
#   bench.txt              the MODULE ENTRY pairs the check times
# and stops with an error if the folder reaches 56 MiB (the machine takes
# 64 MiB with the repository).
set -euo pipefail
cd "$(dirname "$0")/.."
dlc=./target/release/dlc
out=target/gpu-check
limit=$((56 << 20))
rm -rf "$out"
mkdir -p "$out/modules" "$out/ref" "$out/src"
cp target/release/dlc-rt scripts/gpu-check.sh scripts/gpu-profile.sh scripts/gpu_peers.py scripts/torch_workloads.py "$out/"
strip "$out/dlc-rt" 2>/dev/null || true

# The programs besides the workloads, one file each.
cargo run -q --release --locked -p dlc-tests --example gpu_check_programs "$out/src"
# W1 in bf16: 1024 checked against the interpreter, 4096 (too large to hold
# its reference here) timed only, for the tensor-core bar.
cat > "$out/src/gemm_bf16.dl" <<'EOF'
fn gemm_bf16_1024(a: bf16[1024, 1024], b: bf16[1024, 1024]) -> bf16[1024, 1024] {
    return a @ b;
}

fn gemm_bf16_4096(a: bf16[4096, 4096], b: bf16[4096, 4096]) -> bf16[4096, 4096] {
    return a @ b;
}
EOF
for f in examples/w*.dl; do cp "$f" "$out/src/"; done

# NAME [dlc compile flags...]: the module of src/NAME.dl and the reference
# results of each of its entry points (entries and modules in $no_ref are
# timed only: their references would not fit).
no_ref=" gemm_bf16_4096 train_w2 "
module() {
    local name=$1 src=$out/src/${1%_tf32}.dl
    shift
    if ! err=$("$dlc" compile "$src" --target sm_90 --emit gpu-module -o "$out/modules/$name.dlcm" "$@" 2>&1); then
        # A program the GPU back end refuses says why (f64 transcendental
        # functions have no GPU library): listed, not run.
        echo "$name: not compiled: $err" | head -1 >> "$out/refused.txt"
        return
    fi
    # A variant (`_tf32`) shares its source's reference.
    [ -d "$out/ref/${name%_tf32}" ] && return
    local entries
    entries=$("$dlc" check "$src" | sed 's/.*: //; s/,//g; s/)//')
    for entry in $entries; do
        case "$no_ref" in *" $entry "* | *" $name "*) continue ;; esac
        if ! err=$("$dlc" run "$src" --entry "$entry" --backend interp --random-inputs 0 \
            --save-outputs "$out/ref/$name/$entry" 2>&1 > /dev/null); then
            echo "$name $entry: no reference: $err" | head -1 >> "$out/refused.txt"
        fi
    done
}

: > "$out/refused.txt"
for f in "$out"/src/w*.dl "$out"/src/gemm_bf16.dl; do
    module "$(basename "$f" .dl)"
done
module w1_gemm_tf32 --tf32
for f in "$out"/src/diff_*.dl "$out"/src/narrow_*.dl "$out"/src/mma_*.dl "$out"/src/train_*.dl; do
    module "$(basename "$f" .dl)"
done

# What the check times: the workloads, W1 with TF32 and in bf16.
{
    for f in "$out"/src/w*.dl "$out"/src/gemm_bf16.dl; do
        name=$(basename "$f" .dl)
        for entry in $("$dlc" check "$f" | sed 's/.*: //; s/,//g; s/)//'); do
            echo "$name $entry"
        done
    done
    echo "w1_gemm_tf32 gemm_1024"
    echo "w1_gemm_tf32 gemm_2048"
    echo "train_w2 w2_step"
    echo "train_w2 w2_step_bf16"
} > "$out/bench.txt"

size=$(du -sb "$out" | cut -f1)
echo "$out: $(ls "$out/modules" | wc -l) modules, $((size >> 20)) MiB ($(wc -l < "$out/refused.txt") programs refused by the GPU back end)"
if [ "$size" -ge "$limit" ]; then
    echo "error: $out is $size bytes, over the $limit the GPU machine can take with the repository" >&2
    exit 1
fi
