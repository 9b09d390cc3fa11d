"""``python -m gpt.consolidate RUN_DIR``: the command's earlier name, kept; its body is gpt.weights.consolidate."""

from gpt.weights.consolidate import main

if __name__ == "__main__":
    main()
