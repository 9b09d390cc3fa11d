"""Sample from a trained model: python scripts/generate.py ckpt=<run dir> [prompt="..."] [key=value ...]"""

from gpt.cli import hydra_entry


@hydra_entry("generate")
def main(cfg) -> None:
    from gpt.inference.generate import run

    run(cfg)


if __name__ == "__main__":
    main()
