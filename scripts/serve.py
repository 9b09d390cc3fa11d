"""Serve checkpoints over the OpenAI API, with the attention page: python scripts/serve.py ckpt=<run dir> [port=8000]"""

from gpt.cli import hydra_entry


@hydra_entry("serve")
def main(cfg) -> None:
    from gpt.serve.server import run

    run(cfg)


if __name__ == "__main__":
    main()
