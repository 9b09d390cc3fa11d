"""Layouts (model.layers) through the real training loop: a 5:1 local:global layout with a RoPE base per kind, NoPE
on every 4th layer and Qwen3-Next's 3:1 Gated DeltaNet:gated attention each train, resume bit for bit after stopping
halfway, and generate the same greedy text with the cache as without it (scripts/generate.py), their cached logits
equal to the full forward's; scripts/export.py writes each with format=hf (GPT-Neo for the windows-only layout,
remote code for the others) and transformers' greedy text equals scripts/generate.py's."""

from __future__ import annotations

import pytest
import torch

from conftest import run_forked, train_stop_and_resume
from gpt.model.kv_cache import KVCache
from gpt.weights.load import load

pytestmark = pytest.mark.slow

LAYOUTS = {
    "5:1 local:global": ["model.n_layer=6", "model.layers=SSSSSL",
                         "model.layer_kinds={S: {window: 8, designs: [rope]}, "
                         "L: {designs: [rope], options: {rope: {base: 1000000}}}}"],
    "NoPE every 4th": ["model.n_layer=4", "model.layers=RRRN", "model.layer_kinds={R: {designs: [rope]}, N: {}}"],
    "3:1 Gated DeltaNet:gated attention": ["model.n_layer=4", "model.layers=DDDG", "model.norm=rmsnorm",
                                           "model.layer_kinds={D: {designs: [deltanet]}, G: {designs: [gated, rope]}}"],
    "3:1 local:global, learned positions": ["model.n_layer=4", "model.bias=false", "model.layers=SSSL",
                                            "model.layer_kinds={S: {window: 8}, L: {}}"],
}
ARCHITECTURE = {"3:1 local:global, learned positions": "GPTNeoForCausalLM"}  # the others: remote code


@pytest.mark.parametrize("name", LAYOUTS)
def test_a_layout_trains_resumes_bit_for_bit_and_decodes_as_the_full_forward(name, tmp_path, data_args):
    first, resumed, straight = train_stop_and_resume(["model=tiny", *LAYOUTS[name], *data_args], tmp_path, half=2)
    assert any(not torch.equal(first[n], straight[n]) for n in straight)  # it trained
    for key, value in straight.items():
        assert torch.equal(resumed[key], value), key
    run = tmp_path / "straight"
    texts = [run_forked("generate", f"ckpt={run}", "temperature=0", "max_new_tokens=40", "prompt=def",
                        f"kv_cache={cached}", "device=cpu") for cached in ("true", "false")]
    assert texts[0].returncode == 0, texts[0].stderr
    assert texts[0].stdout == texts[1].stdout and len(texts[0].stdout) > 40
    model = load(run, "cpu")[0].eval()
    idx = torch.randint(0, model.config.vocab_size, (1, model.config.block_size), generator=torch.Generator())
    with torch.no_grad():
        full, cache = model(idx)[0], KVCache(model.config, 1, "cpu")
        steps = [model(idx[:, :3], cache=cache)[0]] + [model(idx[:, t:t + 1], cache=cache)[0]
                                                         for t in range(3, idx.size(1))]
    torch.testing.assert_close(torch.cat(steps, dim=1), full, atol=1e-5, rtol=1e-5)
    export = run_forked("export", f"ckpt={run}", f"out={tmp_path / 'hf'}", "format=hf")
    assert export.returncode == 0, export.stderr
    assert ARCHITECTURE.get(name, "remote code") in export.stdout
    assert transformers_greedy_text(tmp_path / "hf", "def", 25) == texts[0].stdout[:3 + 25]


def transformers_greedy_text(folder, prompt: str, new_tokens: int) -> str:
    """The prompt and its greedy continuation as transformers writes them, from the export folder alone."""
    transformers = pytest.importorskip("transformers")
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    model = transformers.AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True).eval()
    ids = torch.tensor([tokenizer(prompt)["input_ids"]])
    with torch.no_grad():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new_tokens, do_sample=False)
    return tokenizer.decode(out[0])
