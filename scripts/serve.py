"""Serve checkpoints over the OpenAI API, with the attention page: python scripts/serve.py ckpt=<run dir> [port=8000]"""

import hydra
from omegaconf import DictConfig

from gpt.cli import report_user_errors
from gpt.schema import register, typed

register("serve")


@hydra.main(config_path="../configs", config_name="serve", version_base=None)
def main(cfg: DictConfig) -> None:
    from gpt.serve.server import run

    report_user_errors(lambda: run(typed(cfg)))


if __name__ == "__main__":
    main()
