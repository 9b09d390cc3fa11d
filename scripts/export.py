"""Export a trained model: python scripts/export.py ckpt=<run dir> [out=<folder>] [format=hf|native] [overwrite=true]
[push_to_hub=<user/name>] -> a folder transformers opens (format=hf) or this project's own layout (format=native)."""

from gpt.cli import hydra_entry


@hydra_entry("export")
def main(cfg) -> None:
    from gpt.weights.export import run

    run(cfg)


if __name__ == "__main__":
    main()
