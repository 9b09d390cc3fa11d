"""A RoPE checkpoint with a scaling applied and no fine-tune: loss by position and passkey retrieval at a longer
length, the same measurements (and windows) as scripts/eval.py's task=positions and task=passkey, for the row
"scaled, not tuned" of docs/long-context.md's extension table.

    python benchmarks/scaled_untuned.py runs/base128 --length 1024 --factor 8 \\
        --out benchmarks/results/long_context/yarn_untuned.json
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout, installed or not

from gpt.evaluation.inputs import open_data  # noqa: E402
from gpt.evaluation.positions import loss_by_position, passkey  # noqa: E402
from gpt.model import GPT  # noqa: E402
from gpt.weights.load import load  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("ckpt")
    parser.add_argument("--length", type=int, default=1024)
    parser.add_argument("--factor", type=float, default=8.0)
    parser.add_argument("--rope-type", default="yarn")
    parser.add_argument("--windows", type=int, default=32)
    parser.add_argument("--buckets", type=int, default=8)
    parser.add_argument("--examples", type=int, default=100)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    model, tokenizer, _ = load(args.ckpt, "cpu")
    scaling = {"rope_type": args.rope_type, "factor": args.factor,
               "original_max_position_embeddings": model.config.block_size}
    rope = {**model.config.design_options.get("rope", {}), "scaling": scaling}
    options = {**model.config.design_options, "rope": rope}
    scaled = GPT(replace(model.config, block_size=args.length, design_options=options)).eval()
    scaled.load_state_dict(model.state_dict())
    val = open_data(None, None, args.ckpt, tokenizer, "val", args.length).splits["val"]
    cpu = torch.device("cpu")
    result = {"ckpt": args.ckpt, "rope_scaling": scaled.config.design_options["rope"]["scaling"],
              "positions": loss_by_position(scaled, val, args.length, args.windows, args.buckets, 8, cpu),
              "passkey": passkey(scaled, tokenizer, val, [args.length], args.examples, 4, "\nPASSKEY = ", 0, 8, cpu)}
    text = json.dumps(result, indent=1)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
