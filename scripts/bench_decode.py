"""Decode speed with and without the KV cache: python scripts/bench_decode.py [ckpt=<run>] [new_tokens=500]"""

from gpt.cli import hydra_entry


@hydra_entry("bench_decode")
def main(cfg) -> None:
    from gpt.bench.decode import run

    print(run(cfg))


if __name__ == "__main__":
    main()
