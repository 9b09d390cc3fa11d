"""Compare tokenizers on a corpus: python scripts/eval_tokenizer.py 'tokenizers=[<folder>,gpt2,char]' data=<source>
-> bytes per token on the train and val documents, and whether each byte-level tokenizer gives every file back."""

from gpt.cli import hydra_entry


@hydra_entry("eval_tokenizer")
def main(cfg) -> None:
    from gpt.evaluation.tokenizer import run

    run(cfg)


if __name__ == "__main__":
    main()
