"""What each head does: python scripts/interpret.py ckpt=<run dir>
analysis=heads|lens|attribution|patching|ablation|curve [prompt=...] [corrupted=...] [ablate=[L1H2]]
[out=<folder>] -> <out>/<analysis>.json and .png (docs/interpret.md)."""

from gpt.cli import hydra_entry


@hydra_entry("interpret")
def main(cfg) -> None:
    from gpt.interpret.command import run

    for path in run(cfg):
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
