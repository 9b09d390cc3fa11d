"""Time to loss: how many steps, tokens and seconds each training recipe needs to reach a validation loss.

python scripts/time_to_loss.py                                      # gpt2 and modern, 3 seeds, the default run
python scripts/time_to_loss.py recipes=[gpt2,modern] seeds=[1] "overrides=[model=tiny,train.max_iters=300]"
"""

import hydra
from omegaconf import DictConfig

from gpt.cli import report_user_errors
from gpt.schema import register, typed

register("time_to_loss")


@hydra.main(config_path="../configs", config_name="time_to_loss", version_base=None)
def main(cfg: DictConfig) -> None:
    from gpt.bench.time_to_loss import run

    report_user_errors(lambda: print(run(typed(cfg))))


if __name__ == "__main__":
    main()
