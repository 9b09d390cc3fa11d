"""Train a byte-level BPE tokenizer: python scripts/train_tokenizer.py data=<source> tokenizer.vocab_size=N
out=<folder> -> <folder>/tokenizer.json (transformers' AutoTokenizer opens the folder), used with data.tokenizer=."""

import hydra
from omegaconf import DictConfig

from gpt.cli import report_user_errors
from gpt.schema import register, typed

register("train_tokenizer")


@hydra.main(config_path="../configs", config_name="train_tokenizer", version_base=None)
def main(cfg: DictConfig) -> None:
    from gpt.tokenizer_train import run

    report_user_errors(lambda: run(typed(cfg)))


if __name__ == "__main__":
    main()
