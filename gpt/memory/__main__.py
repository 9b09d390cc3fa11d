"""``python -m gpt.memory model=... train.batch_size=... [key=value ...]``: print the memory plan of a training run.

The overrides are Hydra's, composed over configs/memory.yaml (the training configs' own groups).
"""

from __future__ import annotations

import sys
from pathlib import Path

from hydra import compose, initialize_config_dir

from gpt.cli import report_user_errors
from gpt.memory import describe
from gpt.schema import register, renamed, typed


def main(argv: list[str] | None = None) -> None:
    """Compose configs/memory.yaml with the command's overrides (Hydra's syntax) and print the plan."""
    argv = sys.argv[1:] if argv is None else argv
    register("memory")
    configs = Path(__file__).resolve().parent.parent.parent / "configs"

    def run() -> str:
        with initialize_config_dir(config_dir=str(configs), version_base=None):
            return describe(typed(compose(config_name="memory", overrides=renamed(argv))))

    print(report_user_errors(run))


if __name__ == "__main__":
    main()
