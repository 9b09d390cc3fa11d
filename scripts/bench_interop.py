"""The interop table (docs/interop.md): python scripts/bench_interop.py

For GPT-2 and every registered design (designs=... via GPT_DESIGNS), a tiny model with random weights is exported
to every target, and the largest |logit difference| from this project's own forward is printed as a markdown table.
"""

from gpt.bench.interop import table
from gpt.cli import bring_designs, report_user_errors


def main() -> None:
    """GPT_DESIGNS' files first (one that fails on import is one error line, as in every script), then the table."""
    bring_designs()
    report_user_errors(lambda: print(table(log=lambda row: None)))


if __name__ == "__main__":
    main()
