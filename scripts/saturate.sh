#!/usr/bin/env bash
# Figures of equality saturation (`graph.saturate`) on W2, W6, W8, the two
# Tensat-style graphs and two written-to-be-improved ones (examples/saturate_*):
# optimization time, e-graph size and estimated cost
# before/after (from `dlc-opt --stats`), and the CPU latency of the program
# compiled without and with it, measured alternately in one run (ROUNDS
# rounds, default 3, of RUNS timed runs, default 20; best median kept), on
# THREADS threads (default 1). Writes target/bench/saturate.{json,md}.
set -euo pipefail
cd "$(dirname "$0")/.."
dlc=./target/release/dlc
opt=./target/release/dlc-opt
out=target/bench
mkdir -p "$out"
plain="graph.inline,graph.canonicalize,graph.dce"
: > "$out/saturate.json"
for spec in w2_mlp:mlp w6_bert_layer:bert_layer w8_gcn:gcn tensat_nasrnn:nasrnn tensat_resnext:resnext saturate_projections:projections saturate_gcn_left:gcn_left; do
    file=examples/${spec%%:*}.dl
    entry=${spec#*:}
    echo "saturate $entry ($file)" >&2
    "$dlc" compile "$file" --entry "$entry" --passes "$plain" -o "$out/$entry.graph"
    stats=$("$opt" "$out/$entry.graph" --passes graph.saturate --stats 2>&1 >/dev/null)
    best_plain="float('inf')"; best_sat="float('inf')"
    for _ in $(seq "${ROUNDS:-3}"); do
        for which in plain full; do
            # the default pipeline (with graph.saturate) when no --passes
            passes=(--passes "$plain"); [ "$which" = full ] && passes=()
            ms=$("$dlc" bench "$file" --entry "$entry" --runs "${RUNS:-20}" --threads "${THREADS:-1}" \
                 "${passes[@]}" --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["median_ms"])')
            if [ "$which" = plain ]; then best_plain=$(python3 -c "print(min($best_plain, $ms))");
            else best_sat=$(python3 -c "print(min($best_sat, $ms))"); fi
        done
    done
    python3 - "$entry" "$best_plain" "$best_sat" "$stats" >> "$out/saturate.json" <<'PY'
import json, sys, re
entry, plain, sat, stats = sys.argv[1], float(sys.argv[2]), float(sys.argv[3]), sys.argv[4]
s = {m.group(2).strip(): int(m.group(1)) for m in re.finditer(r"^\s*(\d+) graph\.saturate - (.*)$", stats, re.M)}
stop = [k for k in s if k.startswith("stopped:")]
ext = [k for k in s if k.startswith("extraction:")]
print(json.dumps({"entry": entry, "opt_ms": s["time (us)"] / 1e3, "eclasses": s["e-classes"],
                  "enodes": s["e-nodes"], "iterations": s["iterations"], "stop": stop[0] if stop else "",
                  "extraction": ext[0] if ext else "",
                  "cost_before_us": s["estimated cost before (ns)"] / 1e3,
                  "cost_after_us": s["estimated cost after (ns)"] / 1e3,
                  "latency_before_ms": plain, "latency_after_ms": sat}))
PY
done
python3 - "$out" <<'PY'
import json, sys
out = sys.argv[1]
rows = [json.loads(l) for l in open(f"{out}/saturate.json") if l.strip()]
lines = ["| graph | opt time (ms) | e-classes / e-nodes | stop | extraction | est. cost before -> after (us) | est. ratio | latency before -> after (ms) | measured ratio |",
         "|---|---|---|---|---|---|---|---|---|"]
for r in rows:
    lines.append(f"| {r['entry']} | {r['opt_ms']:.0f} | {r['eclasses']} / {r['enodes']} | {r['stop'][9:]} | {r['extraction'][12:]} | "
                 f"{r['cost_before_us']:.0f} -> {r['cost_after_us']:.0f} | {r['cost_after_us'] / r['cost_before_us']:.3f} | "
                 f"{r['latency_before_ms']:.2f} -> {r['latency_after_ms']:.2f} | {r['latency_after_ms'] / r['latency_before_ms']:.3f} |")
open(f"{out}/saturate.md", "w").write("\n".join(lines) + "\n")
print("\n".join(lines))
PY
