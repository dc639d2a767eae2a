#!/usr/bin/env bash
# The GPU run of the text and xAR targets (assets/models/TRAINING.md, "On a GPU"): both trained side by side on
# one GPU, each in two phases: a constant LR for P1 minutes, then a linear cool-down sized from phase 1's
# measured rate to last P2 minutes (--resume with --steps/--cooldown-steps). The starting weights travel as
# float16 copies in .gpu/ (scripts/gpu_train/half.py); the trained ones come back the same way, as a tar in
# 15 MiB parts under $OUT. Run from the repository root:
#     python scripts/gpu_train/half.py to16 assets/models/shapes_text_target.safetensors .gpu/shapes_text_target.safetensors
#     python scripts/gpu_train/half.py to16 assets/models/shapes_xar_target.safetensors .gpu/shapes_xar_target.safetensors
#     P1_MIN=2.8 P2_MIN=1.2 DATA_SIZE=100000 bash scripts/gpu_train/train.sh      # on the GPU machine
# A dry run on a CPU: WARMUP=1 P1_MIN=0.15 P2_MIN=0.1 DEVICE=cpu BATCH=4 DATA_SIZE=300 OUT=/tmp/out bash ...
set -u
cd "$(dirname "$0")/../.."
ROOT=$(pwd)
export PYTHONUNBUFFERED=1 GRADIO_ANALYTICS_ENABLED=False
P1=${P1_MIN:-3.0}; P2=${P2_MIN:-1.3}; DEV=${DEVICE:-cuda}; BATCH=${BATCH:-256}; DATA=${DATA_SIZE:-200000}
HALF="python3 $ROOT/scripts/gpu_train/half.py"
OUTDIR=${OUT:-/tmp/out}; mkdir -p /tmp/start /tmp/runs "$OUTDIR"
$HALF to32 .gpu/shapes_text_target.safetensors /tmp/start/shapes_text_target.safetensors
$HALF to32 .gpu/shapes_xar_target.safetensors /tmp/start/shapes_xar_target.safetensors
COMMON="--batch-size $BATCH --warmup-steps ${WARMUP:-100} --ema-decay 0.999 --precision bfloat16 --data-size $DATA \
  --device $DEV --save-every 500 --log-every 50"
TEXT="csd.training.text_models --config shapes_text_target --init-generator /tmp/start/shapes_text_target.safetensors \
  --lr 3e-4 --cond-lr-mult 4 --prompt-only 0.25 --shape-weight 4 --hflip $COMMON"
XAR="csd.training.xar_models --config shapes_xar_target --init-weights /tmp/start/shapes_xar_target.safetensors \
  --lr 2.5e-4 $COMMON"
train() {  # name, then the module and its arguments
  local name=$1; shift
  python3 -m "$@" --out /tmp/runs/$name --steps 1000000 --max-minutes $P1 > /tmp/runs/$name.p1.txt 2>&1 || return 1
  local plan
  plan=$(python3 -c "
import json; t = json.load(open('/tmp/runs/$name.json'))['train']
s, w = t['steps_done'], t['wall_time_s']; c = max(1, int(s / w * 60 * $P2)); print(s + c, c)")
  set -- "$@" --out /tmp/runs/$name --steps ${plan% *} --cooldown-steps ${plan#* } --max-minutes $(python3 -c "print($P1 + $P2 + 1)") --resume
  python3 -m "$@" > /tmp/runs/$name.p2.txt 2>&1
}
train text $TEXT & T=$!
train xar $XAR & X=$!
wait $T; RT=$?; wait $X; RX=$?
{
  echo "exit codes: text $RT xar $RX"; nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null
  python3 -c "import torch; print('torch', torch.__version__)"
  for n in text xar; do echo "== $n"; tail -4 /tmp/runs/$n.p1.txt; tail -6 /tmp/runs/$n.p2.txt; done
} > "$OUTDIR/summary.txt" 2>&1
cd /tmp/runs
for n in text xar; do
  [ -f $n.safetensors ] && $HALF to16 $n.safetensors ${n}_f16.safetensors >> "$OUTDIR/summary.txt" 2>&1
done
tar cf /tmp/back.tar $(ls *_f16.safetensors *_f16.json *.log.jsonl *.txt 2>/dev/null)
split -b 15M /tmp/back.tar "$OUTDIR/back.tar.part-"
ls -la "$OUTDIR"
