"""Prepare a data set: python scripts/prepare.py data=<name> [data.path=...] [force=true]"""

from gpt.cli import hydra_entry


@hydra_entry("prepare")
def main(cfg) -> None:
    from gpt.data.prepare import prepare

    print(f"ready: {prepare(cfg.data, force=cfg.force)}")


if __name__ == "__main__":
    main()
