"""Prepare a data set: python scripts/prepare.py data=<name> [data.path=...] [force=true]"""

import hydra
from omegaconf import DictConfig

from gpt.cli import report_user_errors
from gpt.data.prepare import prepare
from gpt.schema import register, typed

register("prepare")


@hydra.main(config_path="../configs", config_name="prepare", version_base=None)
def main(cfg: DictConfig) -> None:
    def run():
        app = typed(cfg)
        return prepare(app.data, force=app.force)

    print(f"ready: {report_user_errors(run)}")


if __name__ == "__main__":
    main()
