"""GGUF exports run in llama.cpp itself (issue 29), through the llama-cpp-python package, which compiles llama.cpp
from source when it is installed (`pip install llama-cpp-python`, many minutes on 2 cores): the package is not a
dependency, so without it these tests skip. GPT-2 and the Starcoder2 match (RoPE, grouped-query heads) are
written in f32, f16 and Q8_0; llama.cpp's logits for a whole sequence are compared with this project's model on
the weights as the file holds them (gguf's own dequantisation), its tokenizer with this project's ids, and its
greedy continuation with ours. docs/interop.md gives the figures.

Tolerances: llama.cpp computes with its own CPU kernels: its GELU reads a float16 table, and a Q8_0 matrix product
rounds its activations to 8-bit blocks too, which a float32 forward on the rounded weights does not. Measured on
these random models (logits up to about 4): f32 and f16 at most 2.0e-3, Q8_0 at most 6.7e-2 (docs/interop.md).
"""

from __future__ import annotations

import pytest
import torch
from test_gguf import ARCHS, CHARS, TINY, randomised, rounded

from gpt.interop import formats
from gpt.interop import gguf as gguf_export

llama_cpp = pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed (pip install llama-cpp-python "
                                                    "compiles llama.cpp from source)")
TOLERANCE = {"f32": 4e-3, "f16": 4e-3, "q8_0": 1.5e-1}


def load(path) -> llama_cpp.Llama:
    return llama_cpp.Llama(model_path=str(path), n_ctx=TINY["block_size"], n_batch=TINY["block_size"],
                           logits_all=True, n_threads=1, verbose=False, seed=0, type_k=0, type_v=0)  # 0: f32 cache


@pytest.mark.parametrize("kind", gguf_export.TYPES)
@pytest.mark.parametrize("arch", ARCHS)
def test_llama_cpp_runs_the_export_with_the_same_logits_tokens_and_greedy_text(arch, kind, tmp_path):
    model = randomised(ARCHS[arch])
    path = formats.export(model.state_dict(), model.config, CHARS.to_meta(), tmp_path, format="gguf",
                             gguf_type=kind)
    llm = load(path)
    assert llm.n_vocab() == TINY["vocab_size"] and llm.metadata[f"{arch}.context_length"] == str(TINY["block_size"])
    text = "def main():\n    return {'a': 1}  # done"
    assert llm.tokenize(text.encode(), add_bos=False, special=False) == CHARS.encode(text)
    ids = CHARS.encode(text)[: TINY["block_size"]]  # GPT-2's learned positions end there
    llm.eval(ids)
    theirs = torch.from_numpy(llm.scores[: len(ids)].copy())  # [T, vocab]
    ours = model if kind == "f32" else rounded(model, kind)
    with torch.no_grad():
        logits = ours(torch.tensor([ids]))[0][0]  # [T, vocab]
    assert (logits - theirs).abs().max().item() <= TOLERANCE[kind]
    if kind == "f32":  # greedy decoding: ours after each prefix of llama.cpp's 12 tokens, in one pass
        llm.reset()
        prompt = ids[:4]
        generated = []
        for token in llm.generate(prompt, temp=0.0, top_k=1, reset=True):
            generated.append(token)
            if len(generated) == 12:
                break
        with torch.no_grad():
            choices = model(torch.tensor([prompt + generated[:-1]]))[0][0].argmax(-1)
        assert choices[3:].tolist() == generated
