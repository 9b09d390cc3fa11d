"""Serving throughput at 1, 4 and 16 concurrent clients: python scripts/bench_serve.py [ckpt=<run>] [requests=64]"""

from gpt.cli import hydra_entry


@hydra_entry("bench_serve")
def main(cfg) -> None:
    from gpt.bench.serve import run

    print(run(cfg))


if __name__ == "__main__":
    main()
