#!/usr/bin/env bash
# The speedup curves on the embedded model: speedup against concurrency and context length (real drafters),
# speedup against acceptance (synthetic acceptance, laid over engine.bench.stats.formula), and plain decoding's
# scaling with slots. Writes assets/bench/{curves,synthetic,plain}.csv, their union traces.csv, bench.html and PNGs.
# Timings are noisy on a shared CPU: compare ratios within one run (each configuration runs 3 times, interleaved
# with its plain baseline; the median run is kept). OUT=dir to write elsewhere.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-assets/bench}
PY=${PY:-.venv/bin/python}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
mkdir -p "$OUT"
COMMON=(--max-new-tokens 64 --ignore-eos --seed 42 --repeat 3)

# 1. the default n-gram chain (adaptive length) at 1, 2, 4 slots and 0, 512, 1024 tokens of context
$PY -m engine.bench --prompts assets/bench/prompts.jsonl --out "$OUT/curves.csv" "${COMMON[@]}" \
    --n-max 8 --parallel 1,2,4 --ctx-len 0,512,1024 || [ $? -eq 1 ]

# 2. synthetic acceptance at k = 4: each draft token kept with probability P, at 1 and 4 slots
$PY -m engine.bench --prompts assets/bench/prompts.jsonl --out "$OUT/synthetic.csv" "${COMMON[@]}" \
    --spec none --n-max 4 --parallel 1,4 --ctx-len 0 --synthetic-accept 0,0.2,0.4,0.6,0.8,0.95 || [ $? -eq 1 ]

# 3. plain decoding only: aggregate tokens/s of 1, 2, 4 slots on the six copy prompts
$PY -m engine.bench --prompts assets/prompts/copy.jsonl --out "$OUT/plain.csv" "${COMMON[@]}" \
    --spec none --parallel 1,2,4 --ctx-len 0 || [ $? -eq 1 ]

$PY -m engine.bench.plot "$OUT/curves.csv" "$OUT/synthetic.csv" "$OUT/plain.csv" --merged "$OUT/traces.csv" \
    --out "$OUT"
