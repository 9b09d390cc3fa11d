"""Decode speed with and without the KV cache: python scripts/bench_decode.py [ckpt=<run>] [new_tokens=500]"""

import hydra
from omegaconf import DictConfig

from gpt.cli import report_user_errors
from gpt.schema import register, typed

register("bench_decode")


@hydra.main(config_path="../configs", config_name="bench_decode", version_base=None)
def main(cfg: DictConfig) -> None:
    from gpt.bench.decode import run

    print(report_user_errors(lambda: run(typed(cfg))))


if __name__ == "__main__":
    main()
