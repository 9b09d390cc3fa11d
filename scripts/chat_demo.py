"""Base model to assistant, measured: python scripts/chat_demo.py base=<pretrained run> [out_dir=...] [key=value ...]

Builds a synthetic instruction set, measures the base model's exact match on held-out prompts, fine-tunes it with all
weights and with LoRA, and measures both again (docs/chat.md has the figures).
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the demo is benchmarks/chat_demo.py, beside gpt/

from gpt.cli import hydra_entry  # noqa: E402 (after the path above)


@hydra_entry("chat_demo")
def main(cfg) -> None:
    from benchmarks.chat_demo import run

    run(cfg)


if __name__ == "__main__":
    main()
