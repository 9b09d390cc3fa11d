"""Chat with a fine-tuned model in the terminal: python scripts/chat.py ckpt=<run dir> [system="..."] [key=value ...]

/reset starts the conversation over, /quit (or Ctrl-D) leaves, Ctrl-C stops the current reply (docs/chat.md).
"""

from gpt.cli import hydra_entry


@hydra_entry("chat")
def main(cfg) -> None:
    from gpt.inference.chat import run

    run(cfg)


if __name__ == "__main__":
    main()
