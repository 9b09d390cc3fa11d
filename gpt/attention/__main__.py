"""``python -m gpt.attention [device]``: the kernels, which run on this device, and what each supports."""

from __future__ import annotations

import sys

import torch

from gpt import kernels as attention
from gpt.cli import bring_designs, report_user_errors
from gpt.device import resolve_device
from gpt.errors import UserError
from gpt.kernels import support
from gpt.model import design as designs
from gpt.model.design import spell

USAGE = "usage: python -m gpt.attention [auto|cpu|cuda|mps]  (the kernels and designs, tried on that device)"


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] in (["-h"], ["--help"]):
        print(USAGE)
        return
    report_user_errors(lambda: tables(argv))


def tables(argv: list[str]) -> None:
    """Print the kernel table and the design table for the device argv names (one word at most)."""
    if len(argv) > 1:
        raise UserError(f"python -m gpt.attention takes one device at most, got {' '.join(argv)!r}", hint=USAGE)
    bring_designs()  # a design file of GPT_DESIGNS that fails on import: one error line, as in every script
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
          "\nsoftcap, bias, sink: score modifiers, which the designs below ask of a kernel.\n")
    print(designs_table())


def designs_table() -> str:
    """The attention designs (gpt.designs), from their registrations: the setting that turns each on, its settings
    and their defaults, the kernels that can compute it, what its KV cache keeps, the export formats that hold it."""
    rows = []
    for name in designs.available():
        design = designs.get(name)
        kernels = designs.kernels_for(design)
        preset = " ".join(f"model.{k}={spell(v)}" for k, v in design.on_preset().items())
        settings = " ".join(f"{k}={spell(v)}" for k, v in design.options.items()) or "-"
        rows.append({"design": name, "arena preset": preset, "settings (model.design_options.<design>)": settings,
                     "kernels": "its own" if not design.uses_kernel else
                     "any" if kernels == attention.available() else " ".join(kernels),
                     "cache": design.cache.__name__ if design.cache else "keys, values",
                     "exports": " ".join([*design.exports, *(["remote-code"] if design.modeling else [])])})
    columns = list(rows[0])
    widths = {c: max(len(c), *(len(r[c]) for r in rows)) for c in columns}
    lines = ["attention designs (gpt.designs; bring your own: designs=[file.py] or GPT_DESIGNS):", "",
             "  ".join(c.ljust(widths[c]) for c in columns)]
    lines += ["  ".join(r[c].ljust(widths[c]) for c in columns) for r in rows]
    lines += [""] + [f"{name}: {designs.get(name).about}" for name in designs.available()]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
