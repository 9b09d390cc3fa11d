"""Evaluate a model: python scripts/eval.py ckpt=<run dir> [task=heldout|hellaswag] [key=value ...]

A full held-out pass (loss, perplexity, bits per byte) or HellaSwag as lm-evaluation-harness scores it.
"""

import hydra
from omegaconf import DictConfig

from gpt.cli import report_user_errors
from gpt.schema import register, typed

register("eval")


@hydra.main(config_path="../configs", config_name="eval", version_base=None)
def main(cfg: DictConfig) -> None:
    from gpt.evaluation.run import run

    report_user_errors(lambda: run(typed(cfg)))


if __name__ == "__main__":
    main()
