"""Train a GPT: python scripts/train.py [model=small] [attention=sdpa] [data=stdlib_char] [key=value ...]"""

import logging
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from gpt.cli import report_user_errors
from gpt.schema import register

register()


@hydra.main(config_path="../configs", config_name="train", version_base=None)
def main(cfg: DictConfig) -> None:
    from gpt.train.loop import train

    run_dir = Path(HydraConfig.get().runtime.output_dir)
    report_user_errors(lambda: train(cfg, run_dir, log=logging.getLogger("train").info))


if __name__ == "__main__":
    main()
