"""The interop table (docs/interop.md): python scripts/bench_interop.py

For GPT-2 and every registered design (designs=... via GPT_DESIGNS), a tiny model with random weights is exported
to every target, and the largest |logit difference| from this project's own forward is printed as a markdown table.
"""

from gpt.bench.interop import table

if __name__ == "__main__":
    print(table(log=lambda row: None))
