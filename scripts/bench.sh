#!/usr/bin/env bash
# Runs `dlc bench` on every entry point of the workloads W1..W8 and writes
# target/bench/results.json (one object per line) and target/bench/results.md.
# RUNS (default 20) timed runs after 3 warm-ups, with each thread count in
# THREADS (default "1 0": one thread, then one per core). BACKEND=gpu
# measures on GPU 0 instead (threads do not apply; `make bench-gpu`).
set -euo pipefail
cd "$(dirname "$0")/.."
dlc=./target/release/dlc
out=target/bench
mkdir -p "$out"
: > "$out/results.json"
for file in examples/w*.dl; do
    entries=$("$dlc" check "$file" | sed 's/.*: //; s/,//g; s/)//')
    for entry in $entries; do
        if [ "${BACKEND:-cpu}" = gpu ]; then
            echo "bench $entry ($file), --backend gpu" >&2
            "$dlc" bench "$file" --entry "$entry" --runs "${RUNS:-20}" --backend gpu --json >> "$out/results.json"
            continue
        fi
        for threads in ${THREADS:-1 0}; do
            echo "bench $entry ($file), --threads $threads" >&2
            "$dlc" bench "$file" --entry "$entry" --runs "${RUNS:-20}" --threads "$threads" --json >> "$out/results.json"
        done
    done
done
python3 - "$out" <<'PY'
import json, sys
out = sys.argv[1]
rows = [json.loads(l) for l in open(f"{out}/results.json") if l.strip()]
lines = ["| workload | entry | where | cold compile (s) | median (ms) | min (ms) | max (ms) | runs |",
         "|---|---|---|---|---|---|---|---|"]
for r in rows:
    where = r.get("device") or f"{r['threads']} thread(s)"
    lines.append(f"| {r['file'].split('/')[-1]} | {r['entry']} | {where} | {r['compile_s']:.3f} | "
                 f"{r['median_ms']:.3f} | {r['min_ms']:.3f} | {r['max_ms']:.3f} | {r['runs']} |")
open(f"{out}/results.md", "w").write("\n".join(lines) + "\n")
print("\n".join(lines))
PY
