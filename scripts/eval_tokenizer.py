"""Compare tokenizers on a corpus: python scripts/eval_tokenizer.py 'tokenizers=[<folder>,gpt2,char]' data=<source>
-> bytes per token on the train and val documents, and whether each byte-level tokenizer gives every file back."""

import hydra
from omegaconf import DictConfig

from gpt.cli import report_user_errors
from gpt.schema import register, typed

register("eval_tokenizer")


@hydra.main(config_path="../configs", config_name="eval_tokenizer", version_base=None)
def main(cfg: DictConfig) -> None:
    from gpt.evaluation.tokenizer import run

    report_user_errors(lambda: run(typed(cfg)))


if __name__ == "__main__":
    main()
