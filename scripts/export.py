"""Export a trained model: python scripts/export.py ckpt=<run dir> [out=<folder>] [format=hf|native] [overwrite=true]
[push_to_hub=<user/name>] -> a folder transformers opens (format=hf) or this project's own layout (format=native)."""

import hydra
from omegaconf import DictConfig

from gpt.cli import report_user_errors
from gpt.schema import register, typed

register("export")


@hydra.main(config_path="../configs", config_name="export", version_base=None)
def main(cfg: DictConfig) -> None:
    from gpt.export import run

    report_user_errors(lambda: run(typed(cfg)))


if __name__ == "__main__":
    main()
