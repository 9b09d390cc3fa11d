"""``python -m gpt.attention [device]``: the kernels, which run on this device, and what each supports."""

from __future__ import annotations

import sys

import torch

from gpt.attention import support
from gpt.device import resolve_device


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    device = resolve_device(argv[0] if argv else "auto")
    print(f"attention kernels on {device} (torch {torch.__version__}); each option tried on tiny tensors:\n")
    rows = support.support_table(device)
    columns = ["kernel", *support.COLUMNS, "backends"]
    widths = {c: max(len(c), *(len(r[c]) for r in rows)) for c in columns}
    print("  ".join(c.ljust(widths[c]) for c in columns))
    for row in rows:
        print("  ".join(row[c].ljust(widths[c]) for c in columns))
    print()
    for row in rows:
        print(f"{row['kernel']}: {row['about']}")
        for option, reason in row["why"].items():
            print(f"    no {option}: {reason}")
        for line in row["disagrees"]:
            print(f"    its registration {line} (fix the register(...) call)")
    print("\nforward/backward: inference / training; gqa: fewer key-value heads; window: sliding window;"
          "\nmask: a boolean mask (True = may attend); backends: what attention.backend=<name> can pin here."
          "\nScore variants (model options that need them): softcap: logit soft-capping (model.attn_softcap);"
          "\nbias: an additive score bias (model.pos_embedding=alibi); sink: a sink logit per head (model.attn_sink)."
          "\nmodel.qk_norm (QK-norm) and model.pos_embedding=rope act on q and k before the kernel: any kernel."
          "\nmodel.diff_attn (differential attention) calls the kernel twice, on the halves of q and k: any kernel."
          "\nmodel.linear_attn=elu1 (causal linear attention) uses no kernel: gpt.attention.linear computes it."
          "\nmodel.mla_latent (multi-head latent attention) gives the kernel q and k wider than v: any kernel."
          "\nmodel.sink_tokens (StreamingLLM, with model.window) is a mask: any kernel.")


if __name__ == "__main__":
    main()
