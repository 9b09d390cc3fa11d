"""Sampling controls, streaming text, and weights in and out (GPT-2 layout import, export round trip)."""

import io
import json

import pytest
import torch

from conftest import run_forked, run_script, save_char_model
from gpt import GPT, GPTConfig
from gpt.errors import UserError
from gpt.inference.decoding import filter_logits, generate, sample_next
from gpt.inference.text import TextStream
from gpt.interop import formats, gpt2, hf
from gpt.tokenizers.tokenizer import CharTokenizer
from gpt.weights.load import load_model

TINY = GPTConfig(n_layer=2, n_head=2, n_embd=16, block_size=12, vocab_size=40)


def test_top_k_and_top_p_keep_the_right_tokens():
    probs = torch.tensor([[0.5, 0.2, 0.15, 0.1, 0.05]])
    logits = probs.log()
    kept = lambda out: torch.isfinite(out[0]).nonzero().flatten().tolist()  # noqa: E731
    assert kept(filter_logits(logits, top_k=2, top_p=None)) == [0, 1]
    assert kept(filter_logits(logits, top_k=None, top_p=0.5)) == [0]  # 0.5 already reached by the first
    assert kept(filter_logits(logits, top_k=None, top_p=0.7)) == [0, 1]
    assert kept(filter_logits(logits, top_k=None, top_p=0.71)) == [0, 1, 2]
    assert kept(filter_logits(logits[:, [3, 0, 4, 2, 1]], top_k=None, top_p=0.8)) == [1, 3, 4]  # order-free
    assert kept(filter_logits(logits, top_k=None, top_p=1.0)) == [0, 1, 2, 3, 4]


def test_sampling_follows_the_filtered_distribution():
    logits = torch.tensor([[0.5, 0.3, 0.2]]).log().expand(20000, 3)
    draws = sample_next(logits, temperature=1.0, top_p=0.8, generator=torch.Generator().manual_seed(0))
    freq = torch.bincount(draws.flatten(), minlength=3).float() / 20000
    assert freq[2] == 0 and abs(freq[0] - 0.625) < 0.02  # renormalised over the kept 0.5 and 0.3
    assert torch.equal(sample_next(logits[:2], temperature=0.0), torch.zeros(2, 1, dtype=torch.long))


@pytest.mark.parametrize("kw, message", [({"temperature": -1}, "temperature"), ({"top_p": 1.5}, "top_p"),
                                         ({"top_p": 0.0}, "top_p"), ({"top_k": 0}, "top_k")])
def test_bad_sampling_settings_are_refused(kw, message):
    with pytest.raises(ValueError, match=message):
        generate(GPT(TINY), torch.zeros(1, 1, dtype=torch.long), 3, **kw)


def test_generation_stops_when_every_row_produced_the_stop_token():
    torch.manual_seed(0)
    model = GPT(TINY).eval()
    first = int(model(torch.zeros(1, 1, dtype=torch.long))[0][0, -1].argmax())
    out = generate(model, torch.zeros(1, 1, dtype=torch.long), 10, temperature=0.0, stop_token=first)
    assert out.tolist() == [[0, first]]


class BytesTokenizer:
    """Each token is one byte: multi-byte characters arrive in pieces."""

    eot_token = None

    def token_bytes(self, token):
        return bytes([token])


def test_text_stream_joins_utf8_pieces_and_cuts_at_stop_strings():
    out = io.StringIO()
    text = TextStream(BytesTokenizer(), out, stop=["END"])
    data = "héllo ✓ wörld EN".encode() + b"D and more"
    results = [text.add(b) for b in data]
    text.close()
    assert out.getvalue() == "héllo ✓ wörld "
    assert results.index(False) == len("héllo ✓ wörld END".encode()) - 1


def test_text_stream_without_stop_writes_everything():
    out = io.StringIO()
    text = TextStream(CharTokenizer(list("abc\n")), out, stop=[])
    for t in [0, 1, 3, 2]:
        text.add(t)
    text.close()
    assert out.getvalue() == "ab\nc"


def hf_gpt2_tensors(model: GPT) -> dict[str, torch.Tensor]:
    """The model's weights as Hugging Face's GPT-2 checkpoint stores them (Conv1D layout, no prefix)."""
    out = {}
    for name, value in model.state_dict().items():
        if name == "lm_head.weight":
            continue
        if name.endswith(hf.CONV1D_SUFFIXES):
            value = value.t()
        out[name.removeprefix("transformer.")] = value.clone().contiguous()
    for i in range(model.config.n_layer):  # the causal-mask buffer HF stores: must be skipped
        out[f"h.{i}.attn.bias"] = torch.tril(torch.ones(1, 1, model.config.block_size, model.config.block_size))
    return out


def test_gpt2_layout_import_gives_the_same_logits(tmp_path):
    from safetensors.torch import save_file

    torch.manual_seed(0)
    source = GPT(GPTConfig(n_layer=2, n_head=4, n_embd=32, block_size=24, vocab_size=50)).eval()
    save_file(hf_gpt2_tensors(source), str(tmp_path / "model.safetensors"))
    (tmp_path / "config.json").write_text(json.dumps(
        {"model_type": "gpt2", "n_layer": 2, "n_head": 4, "n_embd": 32, "n_positions": 24, "vocab_size": 50}))
    config, state = gpt2.load_gpt2("gpt2", str(tmp_path))
    model = GPT(config).eval()
    model.load_state_dict(state)
    idx = torch.randint(0, 50, (2, 24))
    torch.testing.assert_close(model(idx)[0], source(idx)[0], rtol=0, atol=0)
    assert model.lm_head.weight is model.transformer.wte.weight


def test_export_then_import_is_lossless(tmp_path):
    torch.manual_seed(0)
    model = GPT(TINY).eval()
    tokenizer = CharTokenizer([chr(65 + i) for i in range(40)]).to_meta()
    formats.export(model.state_dict(), TINY, tokenizer, tmp_path / "exp")
    config, state, tok_meta = formats.load_export(tmp_path / "exp")
    assert config == TINY and tok_meta == tokenizer
    for name, value in model.state_dict().items():
        assert torch.equal(state[name], value), name
    loaded, _ = load_model(tmp_path / "exp")
    idx = torch.randint(0, 40, (1, 12))
    assert torch.equal(loaded(idx)[0], model(idx)[0])


def test_missing_gpt2_weights_say_how_to_provide_them(tmp_path):
    with pytest.raises(UserError, match="no model.safetensors"):
        gpt2.load_gpt2("gpt2", str(tmp_path))
    with pytest.raises(UserError, match="unknown GPT-2 model"):
        gpt2.load_gpt2("gpt3")


@pytest.fixture(scope="module")
def checkpoint_dir(tmp_path_factory):
    """A tiny checkpoint of a character model, written directly (no training needed to test sampling)."""
    run = tmp_path_factory.mktemp("ckpt")
    torch.manual_seed(0)
    save_char_model(run / "ckpt.pt", "\nabcdefghij ():", n_layer=1, n_head=2, n_embd=16, block_size=8)
    return run


@pytest.mark.slow
def test_generate_script_prompt_sources_and_long_prompt(checkpoint_dir, tmp_path):
    from_stdin = run_script("generate", f"ckpt={checkpoint_dir}", "prompt_file=-", "max_new_tokens=3", input="ab(")
    assert from_stdin.returncode == 0 and from_stdin.stdout.startswith("ab(") and len(from_stdin.stdout) == 3 + 3 + 1

    prompt = tmp_path / "prompt.txt"
    prompt.write_text("abc\n" * 5)  # 20 characters, longer than block_size 8
    from_file = run_forked("generate", f"ckpt={checkpoint_dir}", f"prompt_file={prompt}", "max_new_tokens=5",
                           "temperature=0")  # a process: from_stdin's
    assert from_file.returncode == 0, from_file.stderr
    assert "keeping its last 8" in from_file.stderr and "Traceback" not in from_file.stderr
    assert from_file.stdout.startswith("abc\nabc\n") and len(from_file.stdout) == 8 + 5 + 1  # last 8, 5 new, newline


@pytest.mark.slow
def test_interactive_loop_and_stop_strings(checkpoint_dir):
    result = run_script("generate", f"ckpt={checkpoint_dir}", "interactive=true", "max_new_tokens=4", "temperature=0",
                        input="ab\nc(\n\n")
    assert result.returncode == 0, result.stderr
    assert result.stdout.count("prompt> ") == 3 and "\nab" not in result.stdout.split("prompt> ")[0]
    assert result.stdout.split("prompt> ")[1].startswith("ab") and result.stdout.split("prompt> ")[2].startswith("c(")
    full = run_forked("generate", f"ckpt={checkpoint_dir}", "prompt=ab", "max_new_tokens=30", "temperature=0")
    generated = full.stdout[2:-1]
    stop = generated[3:5]
    cut = run_forked("generate", f"ckpt={checkpoint_dir}", "prompt=ab", "max_new_tokens=30", "temperature=0",
                     f"stop=[{stop.replace(chr(10), chr(92) + 'n')!r}]".replace("'", '"'))
    assert cut.returncode == 0, cut.stderr
    assert cut.stdout == "ab" + generated[: generated.index(stop)] + "\n"
