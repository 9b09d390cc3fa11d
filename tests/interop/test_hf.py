"""Hugging Face interoperability: exports that transformers opens with the same logits and greedy text, tokenizer
files that reproduce tiktoken, imports that refuse what the model cannot represent, sharded checkpoints, lossless
round trips, padded vocabularies that never generate an undecodable id, and a clean push_to_hub failure."""

import io
import json
import sys
from dataclasses import replace

import pytest
import torch

from conftest import needs_gpt2, run_forked, run_inline, run_script
from gpt import GPT, GPTConfig
from gpt.errors import UserError
from gpt.inference.decoding import generate
from gpt.inference.generate import GenerateConfig, sample_to
from gpt.interop import formats, gpt2, hf
from gpt.interop import targets as hf_targets
from gpt.tokenizers.files import tokenizer_files
from gpt.tokenizers.tokenizer import CharTokenizer
from gpt.weights import load as pretrained
from gpt.weights.load import load_model

try:
    import transformers  # noqa: F401

    HAVE_TRANSFORMERS = True
except ImportError:
    HAVE_TRANSFORMERS = False

needs_transformers = pytest.mark.skipif(not HAVE_TRANSFORMERS,
                                        reason="transformers is not installed (pip install -e '.[dev]')")
CHARS = CharTokenizer(list("\n !\"#$%&'()*+,-./0123456789:;<=>?@ABCDEFGHIJKé✓"))  # 48 characters, some multi-byte


def randomised(config: GPTConfig, seed: int = 3, scale: float = 20.0) -> GPT:
    """Random weights large enough for a varied greedy continuation, biases and LayerNorms randomised too."""
    torch.manual_seed(seed)
    model = GPT(config).eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith(".bias"):
                param.normal_(0.0, 0.5)
            elif ".ln_" in name or "ln_f" in name:
                param.normal_(1.0, 0.3)
            else:
                param.mul_(scale)
    return model


def hf_model(folder):
    """GPT2LMHeadModel.from_pretrained(folder), checking that every tensor was found and used."""
    from transformers import GPT2LMHeadModel

    model, info = GPT2LMHeadModel.from_pretrained(folder, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"], info
    return model.eval()


def assert_transformers_agrees(model: GPT, folder, prompt: list[int], new_tokens: int, eos: int | None = None) -> None:
    """Logits within 1e-4 and the same greedy continuation, with the KV cache on and off on both sides."""
    theirs = hf_model(folder)
    idx = torch.tensor([prompt])
    with torch.no_grad():
        torch.testing.assert_close(theirs(idx).logits, model(idx)[0], rtol=0, atol=1e-4)
    limit = model.config.vocab_size if eos is None else hf.GPT2_VOCAB
    ours = [generate(model, idx, new_tokens, temperature=0.0, kv_cache=kv, stop_token=eos, vocab_limit=limit)
            for kv in (True, False)]
    assert torch.equal(ours[0], ours[1])
    assert len(set(ours[0][0, len(prompt):].tolist())) > 2, "a degenerate continuation would prove little"
    for use_cache in (True, False):
        out = theirs.generate(idx, attention_mask=torch.ones_like(idx), max_new_tokens=new_tokens, do_sample=False,
                              use_cache=use_cache)
        assert out.tolist() == ours[0].tolist(), f"use_cache={use_cache}"


@needs_transformers
@pytest.mark.parametrize("bias", [True, False])
def test_random_weights_export_opens_in_transformers(tmp_path, bias):
    config = GPTConfig(n_layer=2, n_head=4, n_embd=32, block_size=32, vocab_size=CHARS.vocab_size, bias=bias)
    model = randomised(config)
    out = formats.export(model.state_dict(), config, CHARS.to_meta(), tmp_path / "exp")
    hf_cfg = json.loads((out / "config.json").read_text())
    assert hf_cfg["model_type"] == "gpt2" and hf_cfg["architectures"] == ["GPT2LMHeadModel"]
    assert hf_cfg["activation_function"] == "gelu_new" and hf_cfg["n_positions"] == 32
    assert_transformers_agrees(model, out, [1, 2, 3, 4], 25)
    if not bias:  # exported as zero biases: the same function, and bias=false comes back
        assert not hf_model(out).transformer.h[0].attn.c_attn.bias.any()
        assert pretrained.load_weights(out)[0].bias is False


@needs_transformers
def test_character_vocabulary_opens_with_auto_tokenizer(tmp_path):
    from transformers import AutoTokenizer

    config = GPTConfig(n_layer=1, n_head=2, n_embd=16, block_size=16, vocab_size=CHARS.vocab_size)
    out = formats.export(GPT(config).state_dict(), config, CHARS.to_meta(), tmp_path / "exp")
    tokenizer = AutoTokenizer.from_pretrained(out)
    text = "ABC(é✓) 12\n!"
    assert tokenizer(text)["input_ids"] == CHARS.encode(text)
    assert tokenizer.decode(CHARS.encode(text)) == text
    assert pretrained.load_weights(out)[2] == CHARS.to_meta()  # the project reads its own description back


@needs_gpt2
@needs_transformers
def test_gpt2_tokenizer_files_reproduce_tiktoken(tmp_path):
    from transformers import AutoTokenizer

    from gpt.tokenizers.tokenizer import GPT2Tokenizer

    ours = GPT2Tokenizer()
    folder = tmp_path / "tok"
    folder.mkdir()
    for name, text in tokenizer_files(hf.GPT2_TOKENIZER, block_size=64).items():
        (folder / name).write_text(text, encoding="utf-8")
    theirs = AutoTokenizer.from_pretrained(folder)
    text = ("Hello world!  It's 2024 — naïve café, 日本語 テキスト\n\n\tdef f(x):\n        return x**2  \n"
            "  trailing   \r\n emoji 🎉🎉 'll 'VE HTTP/1.1 $12,345.67 ... ??!! 	tab\u00a0nbsp end  ")
    assert theirs(text)["input_ids"] == ours.encode(text)
    assert theirs.decode(ours.encode(text)) == text
    assert theirs.eos_token_id == theirs.bos_token_id == ours.eot_token
    assert theirs("<|endoftext|>")["input_ids"] == [ours.eot_token]  # special in transformers, as for OpenAI's files


@needs_gpt2
@needs_transformers
def test_trained_gpt2_tokenizer_model_opens_in_transformers(tmp_path):
    from gpt.tokenizers.tokenizer import GPT2Tokenizer

    tokenizer = GPT2Tokenizer()
    ids = tokenizer.encode("The quick brown fox jumps over the lazy dog. A journey of a thousand miles begins with "
                           "a single step. " * 6)
    used = sorted(set(ids))  # train on the text's own tokens (fast), then place them at their GPT-2 ids
    data = torch.tensor([used.index(i) for i in ids])
    small = GPTConfig(n_layer=2, n_head=2, n_embd=32, block_size=48, vocab_size=len(used))
    torch.manual_seed(0)
    model = GPT(small)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    for _ in range(40):  # a few steps: enough to learn the text's continuation
        starts = torch.randint(0, len(data) - 25, (4,))
        x = torch.stack([data[s:s + 24] for s in starts])  # (4, 24)
        y = torch.stack([data[s + 1:s + 25] for s in starts])
        _, loss = model(x, y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    config = replace(small, vocab_size=50304)  # GPT-2's vocabulary padded to a multiple of 64, as GPT-2 runs do
    state = dict(model.state_dict())
    wte = torch.randn(config.vocab_size, config.n_embd) * 0.02  # the untrained rows, as initialised
    wte[used] = state["transformer.wte.weight"]
    state["transformer.wte.weight"] = state["lm_head.weight"] = wte
    model = GPT(config).eval()
    model.load_state_dict(state)
    out = formats.export(model.state_dict(), config, tokenizer.to_meta(), tmp_path / "exp")
    assert json.loads((out / "generation_config.json").read_text())["suppress_tokens"] == list(range(50257, 50304))
    assert_transformers_agrees(model, out, tokenizer.encode("A journey"), 20, eos=tokenizer.eot_token)
    config_back, state, meta = pretrained.load_weights(out)
    assert config_back == config and meta == tokenizer.to_meta()
    assert all(torch.equal(state[k], v) for k, v in model.state_dict().items())


def padded_model_preferring(token: int) -> tuple[GPT, GPTConfig]:
    """A GPT-2-vocabulary model padded to 50304 whose every most likely next token is the padded id ``token``."""
    config = GPTConfig(n_layer=1, n_head=2, n_embd=16, block_size=16, vocab_size=50304)
    torch.manual_seed(0)
    model = GPT(config).eval()
    with torch.no_grad():
        ln_f = model.transformer.ln_f
        ln_f.weight.zero_()
        ln_f.bias.copy_(torch.linspace(-1.0, 1.0, 16))  # the final hidden state, whatever the input
        model.transformer.wte.weight[token] = 5.0 * ln_f.bias
    return model, config


@needs_gpt2
def test_padded_vocabulary_never_generates_an_undecodable_id(tmp_path):
    model, config = padded_model_preferring(50300)
    start = torch.tensor([[464]])
    assert generate(model, start, 3, temperature=0.0)[0, 1:].tolist() == [50300] * 3  # what a plain argmax does
    for kw in (dict(temperature=0.0), dict(temperature=1.0, top_k=None)):
        out = generate(model, start, 30, vocab_limit=hf.GPT2_VOCAB, generator=torch.Generator().manual_seed(0), **kw)
        assert out.max() < hf.GPT2_VOCAB
    out_dir = formats.export(model.state_dict(), config, hf.GPT2_TOKENIZER, tmp_path / "exp")
    loaded, tokenizer = load_model(out_dir)
    cfg = GenerateConfig(ckpt=str(out_dir), max_new_tokens=20, temperature=1.0, top_k=None)
    text = io.StringIO()  # the path scripts/generate.py takes: this used to end in a KeyError
    sample_to(text, loaded, tokenizer, "The", cfg, torch.Generator().manual_seed(0), torch.no_grad())
    assert text.getvalue().startswith("The")
    if HAVE_TRANSFORMERS:  # generation_config.json's suppress_tokens keeps transformers off the padded ids too
        theirs = hf_model(out_dir).generate(start, attention_mask=torch.ones_like(start), max_new_tokens=5,
                                            do_sample=False)
        assert theirs.tolist() == generate(model, start, 5, temperature=0.0, vocab_limit=hf.GPT2_VOCAB).tolist()


def gpt2_folder(tmp_path, **config_changes):
    """A tiny Hugging Face GPT-2 folder (config.json + model.safetensors) written through the export."""
    config = GPTConfig(n_layer=2, n_head=2, n_embd=16, block_size=16, vocab_size=CHARS.vocab_size)
    folder = formats.export(randomised(config).state_dict(), config, CHARS.to_meta(), tmp_path / "hf")
    values = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**values, **config_changes}))
    return folder


@pytest.mark.parametrize("field, value", [
    ("tie_word_embeddings", False), ("activation_function", "relu"), ("activation_function", "gelu"),
    ("layer_norm_epsilon", 1e-6), ("scale_attn_by_inverse_layer_idx", True), ("scale_attn_weights", False),
    ("n_inner", 48), ("add_cross_attention", True),
])
def test_import_refuses_what_the_model_cannot_represent(tmp_path, field, value):
    folder = gpt2_folder(tmp_path, **{field: value})
    with pytest.raises(UserError, match=f"{field}={json.dumps(value)}") as err:
        pretrained.load_weights(folder)
    assert "\n" not in str(err.value)
    with pytest.raises(UserError, match=field):  # the same through init_from=gpt2 init_path=<folder>
        gpt2.load_gpt2("gpt2", str(folder))


def test_import_refuses_an_untied_head_and_mismatched_tensors(tmp_path):
    folder = gpt2_folder(tmp_path)
    st = hf.safetensors_torch()
    tensors = st.load_file(str(folder / hf.WEIGHTS))
    st.save_file({**tensors, "lm_head.weight": tensors["transformer.wte.weight"] + 1}, str(folder / hf.WEIGHTS),
                 metadata={"format": "pt"})
    with pytest.raises(UserError, match="tie_word_embeddings"):
        pretrained.load_weights(folder)
    st.save_file({k: v for k, v in tensors.items() if "h.1.mlp.c_fc" not in k}, str(folder / hf.WEIGHTS),
                 metadata={"format": "pt"})
    with pytest.raises(UserError, match=r"config \(missing transformer.h.1.mlp.c_fc.bias; 2 missing"):
        pretrained.load_weights(folder)


def test_sharded_checkpoint_loads(tmp_path):
    folder = gpt2_folder(tmp_path)
    expected = pretrained.load_weights(folder)
    st = hf.safetensors_torch()
    tensors = st.load_file(str(folder / hf.WEIGHTS))
    (folder / hf.WEIGHTS).unlink()
    names = sorted(tensors)
    shards = {"model-00001-of-00002.safetensors": names[: len(names) // 2],
              "model-00002-of-00002.safetensors": names[len(names) // 2:]}
    for shard, keys in shards.items():
        st.save_file({k: tensors[k] for k in keys}, str(folder / shard), metadata={"format": "pt"})
    index = {"metadata": {}, "weight_map": {k: shard for shard, keys in shards.items() for k in keys}}
    (folder / hf.INDEX).write_text(json.dumps(index))
    config, state, tokenizer = pretrained.load_weights(folder)
    assert config == expected[0] and tokenizer == expected[2]
    assert all(torch.equal(state[k], v) for k, v in expected[1].items())
    assert gpt2.load_gpt2("gpt2", str(folder))[0].n_layer == 2  # init_path= takes the sharded folder too
    (folder / "model-00002-of-00002.safetensors").unlink()
    with pytest.raises(UserError, match="model-00002-of-00002.safetensors named by"):
        pretrained.load_weights(folder)


@pytest.mark.parametrize("fmt", ["hf", "native"])
@pytest.mark.parametrize("bias", [True, False])
def test_export_then_import_is_lossless(tmp_path, fmt, bias):
    config = GPTConfig(n_layer=2, n_head=2, n_embd=16, block_size=16, vocab_size=CHARS.vocab_size, bias=bias,
                       dropout=0.1, attention="manual")
    model = randomised(config)
    out = formats.export(model.state_dict(), config, CHARS.to_meta(), tmp_path / "exp", format=fmt)
    config_back, state, meta = pretrained.load_weights(out)
    assert config_back == config and meta == CHARS.to_meta()
    assert set(state) == set(model.state_dict())
    assert all(torch.equal(state[k], v) for k, v in model.state_dict().items())


@pytest.mark.parametrize("option, value", [("designs", ["rope"]), ("n_kv_head", 1), ("window", 4),
                                           ("designs", ["diff"]), ("designs", ["linear"]), ("designs", ["mla"]),
                                           ("activation", "relu2"), ("activation", "gelu"), ("tie_head", False),
                                           ("norm", "rmsnorm")])
def test_what_gpt2_cannot_hold_exports_to_another_target_and_natively(tmp_path, option, value):
    """GPT-2's layout refuses it by name; format=hf picks Starcoder2 or remote code (test_export_designs.py)."""
    config = GPTConfig(n_layer=1, n_head=2, n_embd=16, block_size=16, vocab_size=CHARS.vocab_size, **{option: value})
    model = randomised(config)
    setting = f"model.designs=\\[{value[0]}\\]" if option == "designs" else f"model.{option}={str(value).lower()}"
    with pytest.raises(UserError, match=f"{setting} cannot be exported in the Hugging Face GPT-2 layout"):
        hf.check_representable(config)
    assert hf_targets.choose(config) in ("starcoder2", "remote")
    out = formats.export(model.state_dict(), config, CHARS.to_meta(), tmp_path / "exp", format="native")
    config_back, state, _ = pretrained.load_weights(out)
    assert config_back == config and all(torch.equal(state[k], v) for k, v in model.state_dict().items())


def test_out_is_never_overwritten_without_overwrite_true(tmp_path):
    config = GPTConfig(n_layer=1, n_head=2, n_embd=16, block_size=16, vocab_size=CHARS.vocab_size)
    state, meta = GPT(config).state_dict(), CHARS.to_meta()
    (tmp_path / "file").write_text("mine")
    with pytest.raises(UserError, match="is a file"):
        formats.export(state, config, meta, tmp_path / "file")
    assert (tmp_path / "file").read_text() == "mine"
    out = formats.export(state, config, meta, tmp_path / "exp")
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    with pytest.raises(UserError, match="already holds an export"):
        formats.export(randomised(config).state_dict(), config, meta, out, format="native")
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    formats.export(state, config, meta, out, format="native", overwrite=True)
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "model.safetensors"]  # no stale tokenizer files
    assert pretrained.load_weights(out)[0] == config


def test_push_to_hub_fails_cleanly_without_the_hub(tmp_path, monkeypatch):
    pytest.importorskip("huggingface_hub", reason="huggingface_hub is not installed (the [hf] extra)")
    with pytest.raises(UserError, match="could not push .* to the Hugging Face Hub as me/model") as err:
        hf.push_to_hub(tmp_path, "me/model", endpoint="http://127.0.0.1:9")  # a closed local port: no network used
    assert "\n" not in str(err.value) and "export in" in err.value.hint
    monkeypatch.setitem(sys.modules, "huggingface_hub", None)  # the [hf] extra not installed
    with pytest.raises(UserError, match="needs the huggingface_hub package"):
        hf.push_to_hub(tmp_path, "me/model")


@pytest.mark.slow
def test_export_script_refusals_are_one_line(tmp_path):
    from gpt.weights import checkpoint

    config = GPTConfig(n_layer=1, n_head=2, n_embd=16, block_size=16, vocab_size=CHARS.vocab_size, window=4)
    run = tmp_path / "run"
    run.mkdir()
    checkpoint.save(checkpoint.model_entries(GPT(config).state_dict(), config, CHARS.to_meta()), run / "ckpt.pt")
    exported = run_script("export", f"ckpt={run}")  # a window: GPT-2 cannot hold it, remote code can
    assert exported.returncode == 0 and "remote code: modeling_gpt_attention.py" in exported.stdout, exported.stderr
    again = run_inline("export", f"ckpt={run}", "format=native")
    assert again.returncode == 2 and "already holds an export" in again.stderr and "Traceback" not in again.stderr
    native = run_forked("export", f"ckpt={run}", "format=native", "overwrite=true")  # the first: a process
    assert native.returncode == 0 and not (run / "export" / "modeling_gpt_attention.py").exists(), native.stderr
    bad = run_inline("export", f"ckpt={run}", "format=onnx", "overwrite=true")
    assert bad.returncode == 2 and "format must be one of hf, native" in bad.stderr and "Traceback" not in bad.stderr


def test_an_attention_only_model_is_refused_by_name_in_gpt2s_layout_and_exports_natively(tmp_path):
    config = GPTConfig(n_layer=1, n_head=2, n_embd=16, block_size=16, vocab_size=CHARS.vocab_size, mlp=False)
    model = randomised(config)
    with pytest.raises(UserError, match="model.mlp=false cannot be exported in the Hugging Face GPT-2 layout"):
        hf.check_representable(config)
    with pytest.raises(UserError, match="model.mlp=false .attention-only blocks. has no Hugging Face layout"):
        formats.export(model.state_dict(), config, CHARS.to_meta(), tmp_path / "hf", format="hf")
    assert not (tmp_path / "hf").exists()
    out = formats.export(model.state_dict(), config, CHARS.to_meta(), tmp_path / "exp", format="native")
    config_back, state, _ = pretrained.load_weights(out)
    assert not config_back.mlp and set(state) == set(model.state_dict())
    assert all(torch.equal(state[k], v) for k, v in model.state_dict().items())
