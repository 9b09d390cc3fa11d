"""Attention kernels' time and memory against sequence length.

python scripts/bench_attention.py [device=cpu] ["seq_lens=[64,128]"]
"""

import hydra
from omegaconf import DictConfig

from gpt.cli import report_user_errors
from gpt.schema import register, typed

register("bench_attention")


@hydra.main(config_path="../configs", config_name="bench_attention", version_base=None)
def main(cfg: DictConfig) -> None:
    from gpt.bench.attention import run

    print(report_user_errors(lambda: run(typed(cfg))))


if __name__ == "__main__":
    main()
