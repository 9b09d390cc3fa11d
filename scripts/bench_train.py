"""Training throughput (ms/step, tokens/s, peak memory, MFU), eager vs compile, fp32 vs bf16.

python scripts/bench_train.py [model=gpt2]
"""

import hydra
from omegaconf import DictConfig

from gpt.cli import report_user_errors
from gpt.schema import register, typed

register("bench_train")


@hydra.main(config_path="../configs", config_name="bench_train", version_base=None)
def main(cfg: DictConfig) -> None:
    from gpt.bench.train import run

    print(report_user_errors(lambda: run(typed(cfg))))


if __name__ == "__main__":
    main()
