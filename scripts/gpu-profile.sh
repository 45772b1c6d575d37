#!/usr/bin/env bash
# Where the GPU time of the workloads goes, on a machine with an NVIDIA GPU,
# from the folder `make gpu-check-prepare` makes (where this script is
# copied):
#
#   bash target/gpu-check/gpu-profile.sh [REPORT_DIR]
#
# writes into REPORT_DIR (default $OUT, else ./profile):
# - kernels.json: every workload's kernels timed one by one (`dlc-rt bench
#   --per-kernel`: median of 20 runs, each kernel waited for, launch
#   overhead included), with their grids;
# - ncu_ENTRY.txt: Nsight Compute's speed of light, occupancy and launch
#   statistics of every kernel of W1 2048 (f32 and bf16 4096), W3 b8 and
#   W4, where ncu can read the hardware counters (not under gVisor; it then
#   says why in the file).
# It ends within about 4 minutes.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
report=${1:-${OUT:-$here/profile}}
mkdir -p "$report"
rt=$here/dlc-rt
: > "$report/kernels.json"
while read -r name entry; do
    timeout 120 "$rt" bench "$here/modules/$name.dlcm" --entry "$entry" --runs 20 --json \
        --per-kernel >> "$report/kernels.json" || echo "bench $name $entry failed"
done < "$here/bench.txt"
ncu=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
for spec in "w1_gemm gemm_2048" "gemm_bf16 gemm_bf16_4096" "w3_conv_block conv_block_b8" \
    "w4_attention attention"; do
    set -- $spec
    timeout 90 "$ncu" --clock-control none --section SpeedOfLight --section Occupancy \
        --section LaunchStats "$rt" run "$here/modules/$1.dlcm" --entry "$2" --random-inputs 0 \
        > "$report/ncu_$2.txt" 2>&1 || echo "ncu on $2 failed (status $?)" >> "$report/ncu_$2.txt"
    tail -3 "$report/ncu_$2.txt"
done
python3 - "$report" <<'PY'
import json, os, sys
rows = [json.loads(l) for l in open(os.path.join(sys.argv[1], "kernels.json")) if l.strip()]
for r in rows:
    ks = sorted(r.get("kernels", []), key=lambda k: -k["median_ms"])[:4]
    top = ", ".join(f"{k['kernel'].rsplit('_', 1)[-1]} {k['grid']} {k['median_ms']:.3f}" for k in ks)
    print(f"{os.path.basename(r['file'])} {r['entry']}: {r['median_ms']:.3f} ms; slowest: {top}")
PY
