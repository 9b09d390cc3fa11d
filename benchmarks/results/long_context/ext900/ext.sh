#!/bin/bash
# item 2: base900 (make train's horizon, RoPE) evaluated, YaRN untuned, then two 200-step fine-tunes (lr as the recipe / lr 1/4)
set -x
cd /work/wt/longctx
export OMP_NUM_THREADS=1 PYTHONPATH=$PWD
R=benchmarks/results/long_context/ext900
COMMON="model=small recipe=modern model.n_embd=96 model.designs=[rope] model.block_size=1024 init_from=runs/base900 train.max_iters=200 train.batch_size=4 train.warmup_iters=10 train.decay_frac=0.5 train.min_lr=0 train.eval_interval=200 train.eval_iters=8 train.sample_tokens=0 seed=1337"
YARN='model.design_options.rope.scaling={rope_type: yarn, factor: 8, original_max_position_embeddings: 128}'
uptime > $R/load_start.txt
python3 scripts/train.py $COMMON "$YARN" out_dir=runs/yarn200 > $R/yarn200_train.log 2>&1 &
python3 scripts/train.py $COMMON "$YARN" train.learning_rate=5e-4 train.muon_lr=0.005 out_dir=runs/yarn200_lr4 > $R/yarn200_lr4_train.log 2>&1 &
{
python3 scripts/eval.py ckpt=runs/base900 task=positions long.length=128 long.windows=256 long.buckets=4 out=$R/base_positions_128.json
python3 scripts/eval.py ckpt=runs/base900 task=positions long.length=1024 long.windows=32 long.buckets=8 out=$R/base_positions_1024.json
python3 benchmarks/scaled_untuned.py runs/base900 --length 1024 --factor 8 --out $R/yarn_untuned.json
} > $R/base_eval.log 2>&1
wait
for run in yarn200 yarn200_lr4; do
  python3 scripts/eval.py ckpt=runs/$run task=positions long.length=1024 long.windows=32 long.buckets=8 out=$R/${run}_positions_1024.json
  python3 scripts/eval.py ckpt=runs/$run task=positions long.length=128 long.windows=256 long.buckets=4 out=$R/${run}_positions_128.json
done > $R/tuned_eval.log 2>&1
uptime > $R/load_end.txt
