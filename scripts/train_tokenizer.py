"""Train a byte-level BPE tokenizer: python scripts/train_tokenizer.py data=<source> tokenizer.vocab_size=N
out=<folder> -> <folder>/tokenizer.json (transformers' AutoTokenizer opens the folder), used with data.tokenizer=."""

from gpt.cli import hydra_entry


@hydra_entry("train_tokenizer")
def main(cfg) -> None:
    from gpt.evaluation.tokenizer_train import run

    run(cfg)


if __name__ == "__main__":
    main()
