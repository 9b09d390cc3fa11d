"""Base model to assistant, measured: python scripts/chat_demo.py base=<pretrained run> [out_dir=...] [key=value ...]

Builds a synthetic instruction set, measures the base model's exact match on held-out prompts, fine-tunes it with all
weights and with LoRA, and measures both again (docs/chat.md has the figures).
"""

from gpt.cli import hydra_entry


@hydra_entry("chat_demo")
def main(cfg) -> None:
    from gpt.bench.chat_demo import run

    run(cfg)


if __name__ == "__main__":
    main()
