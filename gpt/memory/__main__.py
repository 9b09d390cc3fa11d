"""``python -m gpt.memory model=... train.batch_size=... [key=value ...]``: print the memory plan of a training run.

The overrides are Hydra's, composed over configs/memory.yaml (the training configs' own groups); config errors get
the same one-line report as every script's (gpt.cli.hydra_entry).
"""

from __future__ import annotations

from gpt.cli import hydra_entry
from gpt.memory import describe


@hydra_entry("memory")
def main(cfg) -> None:
    print(describe(cfg))


if __name__ == "__main__":
    main()
