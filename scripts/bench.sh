#!/usr/bin/env bash
# Runs `dlc bench` on every entry point of the workloads W1..W8 and writes
# target/bench/results.json (one object per line) and target/bench/results.md.
# RUNS (default 20) timed runs after 3 warm-ups, with each thread count in
# THREADS (default "1 0": one thread, then one per core).
set -euo pipefail
cd "$(dirname "$0")/.."
dlc=./target/release/dlc
out=target/bench
mkdir -p "$out"
: > "$out/results.json"
for file in examples/w*.dl; do
    entries=$("$dlc" check "$file" | sed 's/.*: //; s/,//g; s/)//')
    for entry in $entries; do
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
lines = ["| workload | entry | threads | cold compile (s) | median (ms) | min (ms) | max (ms) | runs |",
         "|---|---|---|---|---|---|---|---|"]
for r in rows:
    lines.append(f"| {r['file'].split('/')[-1]} | {r['entry']} | {r['threads']} | {r['compile_s']:.3f} | "
                 f"{r['median_ms']:.3f} | {r['min_ms']:.3f} | {r['max_ms']:.3f} | {r['runs']} |")
open(f"{out}/results.md", "w").write("\n".join(lines) + "\n")
print("\n".join(lines))
PY
