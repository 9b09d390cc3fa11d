"""Prepare a data set: python scripts/prepare.py data=<name> [data.path=...] [force=true]"""

import hydra
from omegaconf import DictConfig, OmegaConf

from gpt.cli import report_user_errors
from gpt.data.config import DataConfig
from gpt.data.prepare import prepare
from gpt.schema import register

register()


@hydra.main(config_path="../configs", config_name="prepare", version_base=None)
def main(cfg: DictConfig) -> None:
    data = DataConfig(**OmegaConf.to_container(cfg.data, resolve=True))
    path = report_user_errors(lambda: prepare(data, force=cfg.force))
    print(f"ready: {path}")


if __name__ == "__main__":
    main()
