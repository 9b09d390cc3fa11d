"""Draw attention maps: python scripts/visualize_attention.py ckpt=<run dir> 'prompt="..."' [layer=] [head=] [out=]"""

import hydra
from omegaconf import DictConfig

from gpt.cli import report_user_errors
from gpt.schema import register, typed

register("visualize")


@hydra.main(config_path="../configs", config_name="visualize_attention", version_base=None)
def main(cfg: DictConfig) -> None:
    from gpt.visualize import run

    print(f"wrote {report_user_errors(lambda: run(typed(cfg)))}")


if __name__ == "__main__":
    main()
