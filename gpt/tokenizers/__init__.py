"""Tokenizers: characters, GPT-2's (tiktoken) and trained byte-level BPE (tokenizer), reading and checking a
byte-level BPE's tokenizer.json (bpe), and tokenizer.json files for every kind (files)."""
