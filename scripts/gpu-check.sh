#!/usr/bin/env bash
# The GPU check: run on a machine with an NVIDIA GPU (its driver, Python with
# PyTorch; no Rust, LLVM or network needed), from the folder that
# `make gpu-check-prepare` makes (target/gpu-check/, where this script is
# copied):
#
#   bash target/gpu-check/gpu-check.sh [REPORT_DIR]
#
# 1. runs every module's entry points on GPU 0 with `dlc-rt run
#    --random-inputs 0 --expect ref/...`: each result against the graph
#    interpreter's within the tolerances of `dlc run --check`;
# 2. times W1..W8 (and W1 with TF32 and in bf16) with `dlc-rt bench`;
# 3. times the same workloads in PyTorch, eager and torch.compile, plus
#    cuBLAS for W1 and fused attention for W4 (gpu_peers.py), in the same run;
# 4. writes the report into REPORT_DIR (default $OUT, else ./report):
#    report.md (the summary and the tables), correctness.txt, dlc.json,
#    peers.json, device.txt and check.log.
# It ends within about 5 minutes; its status is 1 if any result is wrong.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
report=${1:-${OUT:-$here/report}}
mkdir -p "$report"
rt=$here/dlc-rt
exec > >(tee "$report/check.log") 2>&1
start=$SECONDS

nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv \
    > "$report/device.txt" 2>&1 || echo "nvidia-smi failed" >> "$report/device.txt"
cat "$report/device.txt"
"$rt" --version

echo "== correctness: every module against the reference interpreter"
: > "$report/correctness.txt"
for m in "$here"/modules/*.dlcm; do
    name=$(basename "$m" .dlcm)
    for d in "$here/ref/${name%_tf32}"/*/; do
        [ -d "$d" ] || continue
        entry=$(basename "$d")
        if res=$(timeout 120 "$rt" run "$m" --entry "$entry" --random-inputs 0 --expect "$d" 2>&1); then
            echo "ok $name $entry: $(echo "$res" | grep '^check' | sed 's/check: ok: //' | tr '\n' ' ')" >> "$report/correctness.txt"
        else
            echo "FAIL $name $entry: $(echo "$res" | tail -1)" >> "$report/correctness.txt"
        fi
    done
done
ok=$(grep -c '^ok' "$report/correctness.txt")
failed=$(grep -c '^FAIL' "$report/correctness.txt")
grep '^FAIL' "$report/correctness.txt" | head -40
echo "$ok ok, $failed failed ($((SECONDS - start)) s)"

echo "== dlc-rt bench"
: > "$report/dlc.json"
while read -r name entry; do
    if ! timeout 120 "$rt" bench "$here/modules/$name.dlcm" --entry "$entry" --runs 50 --json \
        >> "$report/dlc.json" 2> "$report/bench.err"; then
        python3 -c 'import json,sys; print(json.dumps({"file": sys.argv[1], "entry": sys.argv[2], "error": sys.argv[3]}))' \
            "$name" "$entry" "$(tail -1 "$report/bench.err")" >> "$report/dlc.json"
    fi
done < "$here/bench.txt"
rm -f "$report/bench.err"
cat "$report/dlc.json"
echo "($((SECONDS - start)) s)"

echo "== PyTorch"
PYTHONUNBUFFERED=1 timeout 200 python3 "$here/gpu_peers.py" "$report/peers.json" --runs 50 \
    --compile-budget 60 || echo "gpu_peers.py stopped (status $?)"
echo "($((SECONDS - start)) s)"

python3 - "$report" "$ok" "$failed" <<'PY'
import json, os, sys
report, ok, failed = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
load = lambda f: [json.loads(l) for l in open(os.path.join(report, f)) if l.strip()] \
    if os.path.exists(os.path.join(report, f)) else []
dlc, peers = load("dlc.json"), load("peers.json")
device = open(os.path.join(report, "device.txt")).read().strip().splitlines()[-1]
t = lambda rows, **k: next((r.get("median_ms") for r in rows if all(r.get(a) == b for a, b in k.items())), None)
fmt = lambda x: "-" if x is None else f"{x:.4f}"
lines = [f"# GPU check: {device}", "",
         f"Correctness: {ok} entry points match the reference interpreter, {failed} do not "
         "(correctness.txt).", "",
         "Medians of 50 calls after 3 warm-ups, each call waited for (ms); ratio = dlc / best PyTorch "
         "(below 1: dlc is faster).", "",
         "| module | entry | dlc | torch eager | torch.compile | dlc / best |", "|---|---|---|---|---|---|"]
for r in dlc:
    name, entry = os.path.basename(r["file"]).removesuffix(".dlcm"), r["entry"]
    if name == "gemm_bf16" and entry == "gemm_bf16_1024":
        continue
    d = r.get("median_ms")
    # W1 with TF32 or in bf16 against cuBLAS in that format (eager's column)
    if name.endswith("_tf32"):
        e, c = t(peers, entry=entry, peer="cublas-tf32"), None
    elif name == "gemm_bf16":
        e, c = t(peers, entry=entry.replace("bf16_", ""), peer="cublas-bf16"), None
    else:
        e, c = t(peers, entry=entry, peer="torch-eager"), t(peers, entry=entry, peer="torch-compile")
    best = min([x for x in (e, c) if x is not None], default=None)
    ratio = f"{d / best:.2f}" if d and best else r.get("error", "-")
    lines.append(f"| {name} | {entry} | {fmt(d)} | {fmt(e)} | {fmt(c)} | {ratio} |")
lines += ["", "The bars (throughput of dlc over the peer's; 1.00 is parity):", ""]
def dt(name, entry):
    return next((r.get("median_ms") for r in dlc
                 if os.path.basename(r["file"]).removesuffix(".dlcm") == name and r["entry"] == entry), None)
def bar(what, dlc_ms, peer_ms, need):
    if dlc_ms and peer_ms:
        lines.append(f"- {what}: {peer_ms / dlc_ms:.2f} (bar {need})")
    else:
        lines.append(f"- {what}: not measured")
for n in (1024, 2048):
    bar(f"W1 {n} f32 vs cuBLAS f32", dt("w1_gemm", f"gemm_{n}"), t(peers, entry=f"gemm_{n}", peer="cublas-f32"), "0.90")
    bar(f"W1 {n} TF32 vs cuBLAS TF32", dt("w1_gemm_tf32", f"gemm_{n}"), t(peers, entry=f"gemm_{n}", peer="cublas-tf32"), "-")
bar("W1 4096 bf16 vs cuBLAS bf16", dt("gemm_bf16", "gemm_bf16_4096"), t(peers, entry="gemm_4096", peer="cublas-bf16"), "0.80")
bar("W4 vs scaled_dot_product_attention (f32)", dt("w4_attention", "attention"), t(peers, entry="attention", peer="torch-sdpa-f32"), "0.70")
skipped = [f"{r['entry']} ({r.get('skipped') or r.get('error')})" for r in peers if "median_ms" not in r]
if skipped:
    lines += ["", "PyTorch rows not measured: " + "; ".join(skipped)]
open(os.path.join(report, "report.md"), "w").write("\n".join(lines) + "\n")
print("\n".join(lines))
PY
echo "done in $((SECONDS - start)) s"
[ "$failed" -eq 0 ]
