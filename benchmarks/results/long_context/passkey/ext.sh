#!/bin/bash
# Issue 44's passkey bar: a base trained at 128 with passkey rows mixed in (train.passkey), evaluated unscaled and with
# YaRN untuned at 1,024, then extended with YaRN x8 and 200 steps at 1,024 (passkeys mixed in too), and evaluated.
# usage: ext.sh <base run name under runs/> <extension name> <extension args...>
set -x
cd "$(dirname "$0")/../../../.."
export OMP_NUM_THREADS=1 PYTHONPATH=$PWD
R=benchmarks/results/long_context/passkey
BASE=$1; EXT=$2; shift 2
uptime > $R/${EXT}_load_start.txt
python3 scripts/train.py model=small recipe=modern model.n_embd=96 model.designs=[rope] model.block_size=1024 \
    'model.design_options.rope.scaling={rope_type: yarn, factor: 8, original_max_position_embeddings: 128}' \
    init_from=runs/$BASE train.max_iters=200 train.warmup_iters=10 train.decay_frac=0.5 train.min_lr=0 \
    train.learning_rate=5e-4 train.muon_lr=0.005 train.eval_interval=200 train.eval_iters=8 train.sample_tokens=0 \
    seed=1337 "$@" out_dir=runs/$EXT > $R/${EXT}_train.log 2>&1
{
python3 scripts/eval.py ckpt=runs/$EXT task=positions long.length=1024 long.windows=32 long.buckets=8 out=$R/${EXT}_positions_1024.json
python3 scripts/eval.py ckpt=runs/$EXT task=positions long.length=128 long.windows=256 long.buckets=4 out=$R/${EXT}_positions_128.json
python3 scripts/eval.py ckpt=runs/$EXT task=passkey 'long.lengths=[128,1024]' long.examples=100 out=$R/${EXT}_passkey.json
} > $R/${EXT}_eval.log 2>&1
uptime > $R/${EXT}_load_end.txt
