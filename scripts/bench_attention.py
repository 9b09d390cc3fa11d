"""Attention kernels' time and memory against sequence length.

python scripts/bench_attention.py [device=cpu] ["seq_lens=[64,128]"]
"""

from gpt.cli import hydra_entry


@hydra_entry("bench_attention")
def main(cfg) -> None:
    from gpt.bench.attention import run

    print(run(cfg))


if __name__ == "__main__":
    main()
