"""Training throughput (ms/step, tokens/s, peak memory, MFU), eager vs compile, fp32 vs bf16.

python scripts/bench_train.py [model=gpt2]
"""

from gpt.cli import hydra_entry


@hydra_entry("bench_train")
def main(cfg) -> None:
    from gpt.bench.train import run

    print(run(cfg))


if __name__ == "__main__":
    main()
