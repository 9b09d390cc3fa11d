#!/bin/bash
# The base's own figures, the unscaled and un-tuned ones: loss at 128 and 1,024, passkey at 128 and 1,024, and YaRN x8
# on its weights with no tuning (loss and passkey at 1,024). usage: base_eval.sh <base run name under runs/>
set -x
cd "$(dirname "$0")/../../../.."
export OMP_NUM_THREADS=1 PYTHONPATH=$PWD
R=benchmarks/results/long_context/passkey
B=$1
{
python3 scripts/eval.py ckpt=runs/$B task=positions long.length=128 long.windows=256 long.buckets=4 out=$R/${B}_positions_128.json
python3 scripts/eval.py ckpt=runs/$B task=positions long.length=1024 long.windows=32 long.buckets=8 out=$R/${B}_positions_1024.json
python3 scripts/eval.py ckpt=runs/$B task=passkey 'long.lengths=[128,1024]' long.examples=100 out=$R/${B}_passkey.json
python3 benchmarks/scaled_untuned.py runs/$B --length 1024 --factor 8 --out $R/${B}_yarn_untuned.json
uptime
} > $R/${B}_eval.log 2>&1
