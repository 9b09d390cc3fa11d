"""Sample from a trained model: python scripts/generate.py ckpt=<run dir> [prompt="..."] [key=value ...]"""

import hydra
from omegaconf import DictConfig

from gpt.cli import report_user_errors
from gpt.schema import register, typed

register("generate")


@hydra.main(config_path="../configs", config_name="generate", version_base=None)
def main(cfg: DictConfig) -> None:
    from gpt.generate import run

    report_user_errors(lambda: run(typed(cfg)))


if __name__ == "__main__":
    main()
