"""Serving throughput at 1, 4 and 16 concurrent clients: python scripts/bench_serve.py [ckpt=<run>] [requests=64]"""

import hydra
from omegaconf import DictConfig

from gpt.cli import report_user_errors
from gpt.schema import register, typed

register("bench_serve")


@hydra.main(config_path="../configs", config_name="bench_serve", version_base=None)
def main(cfg: DictConfig) -> None:
    from gpt.bench.serve import run

    print(report_user_errors(lambda: run(typed(cfg))))


if __name__ == "__main__":
    main()
