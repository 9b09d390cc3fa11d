"""Evaluate a model: python scripts/eval.py ckpt=<run dir> [task=heldout|hellaswag] [key=value ...]

A full held-out pass (loss, perplexity, bits per byte) or HellaSwag as lm-evaluation-harness scores it.
"""

from gpt.cli import hydra_entry


@hydra_entry("eval")
def main(cfg) -> None:
    from gpt.evaluation.run import run

    run(cfg)


if __name__ == "__main__":
    main()
