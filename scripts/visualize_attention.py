"""Draw attention maps: python scripts/visualize_attention.py ckpt=<run dir> 'prompt="..."' [layer=] [head=] [out=]"""

from gpt.cli import hydra_entry


@hydra_entry("visualize", "visualize_attention")
def main(cfg) -> None:
    from gpt.inference.visualize import run

    print(f"wrote {run(cfg)}")


if __name__ == "__main__":
    main()
