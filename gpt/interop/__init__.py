"""Other tools' formats: the Hugging Face GPT-2 layout (hf), the other transformers targets (targets: Starcoder2,
remote code, whose parts are modeling/), GGUF for llama.cpp (gguf)."""
