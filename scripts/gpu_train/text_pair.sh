#!/usr/bin/env bash
# The GPU run of the text pair (assets/models/TRAINING.md, last section): the text target continued, then
# the text draft distilled from it (--distill-from), one after the other on one GPU. Each runs two phases: a
# constant LR for P1 minutes, then a linear cool-down sized from phase 1's measured rate to last P2 minutes
# (--resume with --steps/--cooldown-steps). The teacher is the trained target rounded to float16 and widened
# back, the very weights that come back and ship, so the draft's record names the shipped target's digest.
# Starting weights travel as float16 copies in .gpu/ (scripts/gpu_train/half.py); the trained ones come back
# the same way under $OUT (the target in 15 MB parts: cat them back together). Allow about 40 s of start-up per
# phase beyond T1+T2+D1+D2. Run from the repository root:
#     python scripts/gpu_train/half.py to16 assets/history/tried/shapes_text_target_gpu.safetensors .gpu/text_target.safetensors
#     python scripts/gpu_train/half.py to16 assets/models/shapes_text_draft.safetensors .gpu/text_draft.safetensors
#     bash scripts/gpu_train/text_pair.sh      # on the GPU machine
# A dry run on a CPU: T1=0.1 T2=0.05 D1=0.1 D2=0.05 WARMUP=1 DEVICE=cpu BATCH=4 DATA_SIZE=300 OUT=/tmp/out bash ...
set -u
cd "$(dirname "$0")/../.."
ROOT=$(pwd)
export PYTHONUNBUFFERED=1 GRADIO_ANALYTICS_ENABLED=False
T1=${T1:-3.0}; T2=${T2:-1.3}; D1=${D1:-1.5}; D2=${D2:-0.7}
DEV=${DEVICE:-cuda}; BATCH=${BATCH:-256}; DATA=${DATA_SIZE:-100000}
HALF="python3 $ROOT/scripts/gpu_train/half.py"
OUTDIR=${OUT:-/tmp/out}; R=/tmp/runs; mkdir -p /tmp/start $R "$OUTDIR"
$HALF to32 .gpu/text_target.safetensors /tmp/start/text_target.safetensors
$HALF to32 .gpu/text_draft.safetensors /tmp/start/text_draft.safetensors
COMMON="--batch-size $BATCH --warmup-steps ${WARMUP:-100} --ema-decay 0.999 --precision bfloat16 --data-size $DATA \
  --device $DEV --save-every 500 --log-every 50 --prompt-only 0.25 --shape-weight 4 --hflip"
train() {  # name, P1, P2, then the module and its arguments
  local name=$1 p1=$2 p2=$3; shift 3
  python3 -m "$@" --out $R/$name --steps 1000000 --max-minutes $p1 > $R/$name.p1.txt 2>&1 || return 1
  local plan
  plan=$(python3 -c "
import json; t = json.load(open('$R/$name.json'))['train']
s, w = t['steps_done'], t['wall_time_s']; c = max(1, int(s / w * 60 * $p2)); print(s + c, c)")
  set -- "$@" --out $R/$name --steps ${plan% *} --cooldown-steps ${plan#* } --max-minutes $(python3 -c "print($p1 + $p2 + 1)") --resume
  python3 -m "$@" > $R/$name.p2.txt 2>&1
}
train text_target $T1 $T2 csd.training.text_models --config shapes_text_target \
  --init-generator /tmp/start/text_target.safetensors --lr 3e-4 --cond-lr-mult 4 $COMMON
RT=$?
# the teacher: the target as it ships (float16, widened)
$HALF to16 $R/text_target.safetensors $R/text_target_f16.safetensors > $R/round.txt 2>&1
$HALF to32 $R/text_target_f16.safetensors /tmp/start/teacher.safetensors >> $R/round.txt 2>&1
# back even if the draft runs out of time; the target (19.9 MB) in parts under the tool's 16 MiB a file
split -b 15M $R/text_target_f16.safetensors "$OUTDIR/text_target_f16.safetensors.part-"
cp $R/text_target_f16.json $R/text_target.log.jsonl $R/text_target.p*.txt "$OUTDIR"/
train text_draft $D1 $D2 csd.training.text_models --config shapes_text_draft \
  --init-generator /tmp/start/text_draft.safetensors --distill-from /tmp/start/teacher.safetensors --lr 5e-4 $COMMON
RD=$?
{
  echo "exit codes: target $RT draft $RD"; nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null
  python3 -c "import torch; print('torch', torch.__version__)"
  for n in text_target text_draft; do echo "== $n"; tail -3 $R/$n.p1.txt; tail -5 $R/$n.p2.txt; done
  cat $R/round.txt
  python3 -c "from csd.models.checkpoint import file_digest; print('teacher digest', file_digest('/tmp/start/teacher.safetensors'))"
} > "$OUTDIR/summary.txt" 2>&1
[ -f $R/text_draft.safetensors ] && $HALF to16 $R/text_draft.safetensors $R/text_draft_f16.safetensors >> "$OUTDIR/summary.txt" 2>&1
cd $R && cp text_draft_f16.safetensors text_draft_f16.json text_draft.log.jsonl *.txt "$OUTDIR"/ 2>/dev/null
ls -la "$OUTDIR"
