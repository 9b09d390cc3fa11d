"""Set up the side-by-side against nanoGPT (docs/benchmarks.md): the same tokens, model and training on both sides.

    python benchmarks/vs_nanogpt.py --nanogpt ~/nanoGPT [--data data/stdlib_char] [--out /tmp/vs_nanogpt] [--steps 300]

writes a prepared data set of this project into nanoGPT's format (train.bin, val.bin, meta.pkl) under --out, with
a nanoGPT config file of this project's default model and training at nanoGPT's math (exact GELU, fp32, no compile),
then prints the two commands to time, each a whole process (e.g. under /usr/bin/time -v, turn by turn).
"""

from __future__ import annotations

import argparse
import pickle
import shlex
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout, installed or not

from gpt.cli import report_user_errors  # noqa: E402 (after the path above)
from gpt.data.loader import TokenData  # noqa: E402
from gpt.errors import UserError  # noqa: E402

# nanoGPT's settings; each matches this project's default (configs/model/small.yaml, gpt.train.config.TrainConfig)
NANOGPT = """device = 'cpu'; dtype = 'float32'; compile = False
n_layer = 4; n_head = 4; n_embd = 128; block_size = 128; dropout = 0.0; bias = True
batch_size = 32; gradient_accumulation_steps = 1
learning_rate = 2e-3; min_lr = 2e-4; warmup_iters = 100; weight_decay = 0.1; beta1 = 0.9; beta2 = 0.95
grad_clip = 1.0; eval_iters = 20; log_interval = 10; always_save_checkpoint = False
"""


def write_nanogpt_data(data: TokenData, folder: Path) -> None:
    """train.bin and val.bin (uint16 token ids, every shard in order) and, for characters, meta.pkl."""
    if data.splits["train"].dtype != np.uint16:
        raise UserError(f"nanoGPT reads uint16 token ids; {data.dir} holds {data.splits['train'].dtype}")
    folder.mkdir(parents=True, exist_ok=True)
    for split, stream in data.splits.items():
        stream[0:len(stream)].tofile(folder / f"{split}.bin")
    tokenizer = data.tokenizer.to_meta()
    if tokenizer["kind"] == "char":  # nanoGPT takes vocab_size from meta.pkl (sample.py the two maps)
        chars = tokenizer["chars"]
        meta = {"vocab_size": len(chars), "itos": dict(enumerate(chars)), "stoi": {c: i for i, c in enumerate(chars)}}
        (folder / "meta.pkl").write_bytes(pickle.dumps(meta))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nanogpt", required=True, type=Path, help="a checkout of karpathy/nanoGPT")
    parser.add_argument("--data", default="data/stdlib_char", type=Path, help="a data set prepared by this project")
    parser.add_argument("--out", default="/tmp/vs_nanogpt", type=Path)
    parser.add_argument("--steps", default=300, type=int, help="optimizer steps on each side")
    args = parser.parse_args()
    if not (args.nanogpt / "train.py").is_file():
        raise UserError(f"{args.nanogpt} holds no train.py", hint="give --nanogpt a checkout of karpathy/nanoGPT")
    data = TokenData(args.data)
    out = args.out.resolve()
    write_nanogpt_data(data, out / "data" / data.dir.name)
    # nanoGPT trains steps 0..max_iters and evaluates when iter % eval_interval == 0: with max_iters = eval_interval
    # = steps - 1 it makes `steps` steps and two evaluations, as this project does (at step 0 and at the end)
    last, dataset = args.steps - 1, out / "data" / data.dir.name
    (out / "config_vs.py").write_text(f"out_dir = {str(out / 'out')!r}\ndataset = {str(dataset)!r}\n"
                                      f"max_iters = {last}; eval_interval = {last}; lr_decay_iters = {args.steps}\n"
                                      + NANOGPT)
    ours = (f"python scripts/train.py data={data.dir.name} device=cpu precision=fp32 model.activation=gelu "
            f"train.max_iters={args.steps} train.eval_interval={args.steps} train.eval_iters=20 "
            f"train.log_interval=10 train.sample_tokens=0 out_dir=$(mktemp -d)")
    print(f"nanoGPT's data and config are in {out}. Time each command as a whole process, turn by turn, with the "
          f"same OMP_NUM_THREADS:\n  this project (from {Path.cwd()}):\n    {ours}\n"
          f"  nanoGPT:\n    cd {shlex.quote(str(args.nanogpt.resolve()))} && python train.py {out / 'config_vs.py'}")


if __name__ == "__main__":
    report_user_errors(main)
