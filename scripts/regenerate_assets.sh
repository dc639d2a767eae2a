#!/usr/bin/env bash
# Regenerate everything in the repository that is computed from the shipped weights, after new weights
# are copied to assets/models/: the app's precomputed analysis panels, the three sample sheets, the
# training curves, the benchmark (its tables in docs/results.md and the README) and the probe table (printed only).
# Run it alone on the machine (the benchmark times things), from the repository root:
#
#   bash scripts/regenerate_assets.sh [PREVIOUS_TARGET.safetensors]
#
# With PREVIOUS_TARGET, the probe compares it with the shipped target. Last, the browser test rewrites the
# app screenshots in assets/ (tests/demo/test_app_browser.py with CSD_SCREENSHOT_DIR=assets). On the 2-core
# CPU this takes about four hours (the three frontiers, about an hour each, most of it).
set -euo pipefail
cd "$(dirname "$0")/.."
export GRADIO_ANALYTICS_ENABLED=False
M=assets/models
H=assets/history/stages  # the records and logs of the earlier training stages

echo "== analysis panels"
python -m csd.experiments.analysis --out assets/analysis_default.json --threads 1

echo "== sample sheets (the same seeds and labels in all three)"
for mode in target csd draft; do
  python -m csd.experiments.evaluate --mode "$mode" --n 80 --sheet "assets/samples_${mode}.png" \
    --out "/tmp/samples_${mode}.json" > /dev/null
done

echo "== training curves (every stage's log, oldest first)"
chain() {  # <name>_stage1.log.jsonl+...+<name>.log.jsonl
  local name=$1 k=1 logs=""
  while [[ -f "$H/${name}_stage${k}.log.jsonl" ]]; do logs+="$H/${name}_stage${k}.log.jsonl+"; k=$((k + 1)); done
  echo "${logs}$M/${name}.log.jsonl"
}
python -m visualize.training_curves "$(chain shapes_target)" "$(chain shapes_draft)" --out "$M/training_curves.png"

echo "== benchmark"
python -m csd.serving.catalog  # docs/families.json: how the tables below name each family and its docs blocks
python -m csd.experiments.bench --quick --n 200 --threads 1 --gammas 1 2 4 8 --quality-gammas 1 2 4 --out bench/results
python -m visualize.report bench/results/bench.json  # the tables into docs/results.md, the README's headline and families
# the frontier at batch 1 and 8 in one run (dense grid; about an hour here)
python -m csd.experiments.bench --frontier --threads 1 --n 100 --n-ref 1000 --repeats 3 --out bench/results
python -m visualize.report bench/results/frontier_b1.json bench/results/frontier_b8.json

echo "== the xAR pair: training curves and benchmark"
python -m visualize.training_curves "$(chain shapes_xar_target)" "$M/shapes_xar_draft.log.jsonl" \
  --loss "flow matching on noisy-context cells" --out "$M/training_curves_xar.png"
python -m csd.experiments.bench --quick --threads 1 --target "$M/shapes_xar_target.safetensors" \
  --draft "$M/shapes_xar_draft.safetensors" --num-steps 16 --cfg-schedule linear --out bench/results/xar
python -m visualize.report bench/results/xar/bench.json
python -m csd.experiments.bench --frontier --threads 1 --n 100 --n-ref 1000 --repeats 3 --target "$M/shapes_xar_target.safetensors" \
  --draft "$M/shapes_xar_draft.safetensors" --num-steps 16 --cfg-schedule linear --out bench/results/xar
python -m visualize.report bench/results/xar/frontier_b1.json bench/results/xar/frontier_b8.json

echo "== the text pair: benchmark and frontier"
python -m csd.experiments.bench --quick --threads 1 --target "$M/shapes_text_target.safetensors" \
  --draft "$M/shapes_text_draft.safetensors" --out bench/results/text
python -m visualize.report bench/results/text/bench.json
python -m csd.experiments.bench --frontier --threads 1 --n 100 --n-ref 1000 --repeats 3 --target "$M/shapes_text_target.safetensors" \
  --draft "$M/shapes_text_draft.safetensors" --out bench/results/text
python -m visualize.report bench/results/text/frontier_b1.json bench/results/text/frontier_b8.json

if [[ $# -ge 1 ]]; then
  echo "== probe: $1 vs the shipped target"
  python -m csd.shapes.probe "$1" "$M/shapes_target.safetensors" --n 200
fi

echo "== the shipped models' facts for the model cards (assets/models/facts.json)"
python -m demo.cards

echo "== the page's precomputed comparisons (first sight and gallery)"
python -m demo.precompute

echo "== request times of every default and preset, beside the page's estimates"
python -m scripts.request_times

echo "== app screenshots (headless Chromium)"
CSD_SCREENSHOT_DIR=assets python -m pytest -q tests/demo/test_app_browser.py  # screenshot_generate, _first_sight, _inspect, _prompt, _red_star, _xar, _phone and screenshot.png
