"""Trained byte-level BPE tokenizers: training on a corpus the project reads, the folder transformers opens with the
same ids, exact round trips (bytes that are not UTF-8 included), preparation that records the tokenizer and refuses
another, exports that carry it, and damaged tokenizer.json files refused with one line."""

import json
import random
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from conftest import needs_gpt2
from gpt import GPT, GPTConfig
from gpt.data.config import DataConfig
from gpt.data.loader import TokenData
from gpt.data.prepare import prepare
from gpt.errors import ConfigError, UserError
from gpt.evaluation.heldout import byte_lengths
from gpt.evaluation.tokenizer_train import BPEConfig, TrainTokenizerConfig, run
from gpt.interop import formats
from gpt.tokenizers import bpe
from gpt.tokenizers import tokenizer as tok
from gpt.weights import checkpoint
from gpt.weights import load as pretrained

ROOT = Path(__file__).resolve().parents[2]
QUIET = {"log": lambda message: None}
pytestmark = pytest.mark.filterwarnings("ignore:.*not UTF-8:UserWarning")  # the Latin-1 file, read as text
LATIN1 = "latin1.txt"
LITERAL = "literal.txt"


def make_corpus(folder):
    """This project's data package as text, one file in Latin-1 (not UTF-8) and one naming a special token."""
    folder.mkdir(parents=True)
    for path in sorted((ROOT / "gpt" / "data").glob("*.py")):
        shutil.copy(path, folder / path.name)
    (folder / LATIN1).write_bytes("café, naïve, déjà vu: not UTF-8\n".encode("latin-1") * 3)
    (folder / LITERAL).write_text("a document that says <|endoftext|> and <|im_start|>user in its text\n")
    return folder


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A 600-token BPE trained on make_corpus, its folder and training report."""
    root = tmp_path_factory.mktemp("bpe")
    corpus = make_corpus(root / "corpus")
    cfg = TrainTokenizerConfig(data=DataConfig(source="path", path=str(corpus), root=str(root / "data")),
                               tokenizer=BPEConfig(vocab_size=600), out=str(root / "tok"))
    out = run(cfg, **QUIET)
    return root, out, json.loads((out / "report.json").read_text())


def test_training_writes_a_folder_with_the_special_tokens_first(trained):
    _, out, report = trained
    tokenizer = tok.BPETokenizer.from_file(out)
    assert tokenizer.vocab_size == report["vocab_size"] == 600
    assert tokenizer.special_tokens == {"<|endoftext|>": 0, "<|im_start|>": 1, "<|im_end|>": 2, "<|pad|>": 3}
    assert tokenizer.eot_token == 0 and tok.has_tokens(tokenizer, *bpe.CHAT_TOKENS)
    assert tokenizer.to_meta()["sha256"] == report["sha256"]
    assert tok.from_meta(tokenizer.to_meta()).to_meta() == tokenizer.to_meta()
    assert {p.name for p in out.iterdir()} == {"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                                              "report.json"}


def test_auto_tokenizer_gives_the_same_ids_as_the_project(trained):
    pytest.importorskip("transformers")
    from transformers import AutoTokenizer

    root, out, _ = trained
    ours, theirs = tok.BPETokenizer.from_file(out), AutoTokenizer.from_pretrained(out)
    texts = [p.read_text(errors="replace") for p in sorted((root / "corpus").iterdir())]
    texts.append("Ünïcödé ✓ 日本語 🎉\r\n\ttabs  and   spaces  ")
    for text in texts:  # transformers makes special-token text special unless told to split it; this project never
        ids = ours.encode(text)
        assert theirs(text, split_special_tokens=True)["input_ids"] == ids
        assert theirs.decode(ids) == ours.decode(ids) == text
    assert theirs("<|im_end|>")["input_ids"] == [2] and ours.encode("<|im_end|>") != [2]
    assert (theirs.eos_token_id, theirs.bos_token_id, theirs.pad_token_id) == (0, 0, 3)


def test_evaluation_finds_every_file_given_back_exactly(trained):
    _, _, report = trained
    rows = {row["name"]: row for row in report["evaluation"]["tokenizers"]}
    ours = rows[next(iter(rows))]
    assert ours["round_trip"]["exact"] and ours["round_trip"]["files_not_utf8"] == 1
    assert ours["round_trip"]["documents"] == sum(report["evaluation"]["documents"].values()) + 1  # + the raw file
    assert rows["char"]["round_trip"] is None and rows["char"]["bytes_per_token"]["train"] > 1.0  # é is 2 bytes
    assert ours["bytes_per_token"]["train"] > 2.0 * rows["char"]["bytes_per_token"]["train"]
    assert report["trained_on"]["documents"] == report["evaluation"]["documents"]["train"]  # val held out


def test_any_bytes_round_trip_and_lone_surrogates_encode(trained):
    _, out, _ = trained
    tokenizer = tok.BPETokenizer.from_file(out)
    rng = random.Random(0)
    for size in (1, 7, 300):
        data = bytes(rng.randrange(256) for _ in range(size)) + "é✓".encode() + b"\xff\xfe"
        assert tok.decode_bytes(tokenizer, tok.encode_bytes(tokenizer, data)) == data
    assert tokenizer.encode("a\ud800b") == tokenizer.encode("a\ufffdb")  # a JSON escape: U+FFFD, as tiktoken


def test_training_is_deterministic_and_refuses_bad_settings(trained, tmp_path):
    root, out, report = trained
    again = run(TrainTokenizerConfig(data=DataConfig(source="path", path=str(root / "corpus")),
                                     tokenizer=BPEConfig(vocab_size=600), out=str(tmp_path / "again"), evaluate=False),
                **QUIET)
    assert (again / "tokenizer.json").read_bytes() == (out / "tokenizer.json").read_bytes()
    with pytest.raises(UserError, match="already holds a tokenizer.json"):
        run(TrainTokenizerConfig(data=DataConfig(source="path", path=str(root / "corpus")), out=str(again)), **QUIET)
    with pytest.raises(ConfigError, match="at least 261"):
        BPEConfig(vocab_size=260)
    with pytest.raises(ConfigError, match="distinct"):
        BPEConfig(special_tokens=["<|a|>", "<|a|>"])


def test_prepared_data_records_the_tokenizer_and_refuses_another(trained, tmp_path):
    root, out, _ = trained
    corpus = str(root / "corpus")
    cfg = DataConfig(name="b", source="path", path=corpus, tokenizer=str(out), root=str(tmp_path))
    data_dir = prepare(cfg, **QUIET)
    data = TokenData(data_dir)
    assert data.tokenizer.to_meta() == tok.BPETokenizer.from_file(out).to_meta()
    ids = np.concatenate([data.splits[s][:] for s in ("train", "val")])
    assert (ids == 0).sum() == sum(data.meta["splits"][s]["documents"] for s in ("train", "val"))  # one eot each
    assert data.meta["dtype"] == "uint16" and data.meta["source"]["settings"]["document_end"] == "<|endoftext|>"
    unset = DataConfig(name="b", source="path", path=corpus, root=str(tmp_path))
    assert prepare(unset, **QUIET) == data_dir  # no tokenizer argument: the prepared one
    other = run(TrainTokenizerConfig(data=DataConfig(source="path", path=corpus), tokenizer=BPEConfig(vocab_size=300),
                                     out=str(tmp_path / "other"), evaluate=False), **QUIET)
    for wrong, label in (("char", "the char tokenizer"), (str(other), "300-token BPE")):
        with pytest.raises(UserError, match=f"with the 600-token BPE [0-9a-f]{{8}} tokenizer, not .* {label}"):
            prepare(DataConfig(name="b", source="path", path=corpus, tokenizer=wrong, root=str(tmp_path)), **QUIET)
    with pytest.raises(UserError, match="unknown data.tokenizer 'nowhere'"):
        prepare(DataConfig(name="c", source="path", path=corpus, tokenizer="nowhere", root=str(tmp_path)), **QUIET)


def test_special_tokens_count_no_bytes_in_bits_per_byte(trained):
    _, out, _ = trained
    tokenizer = tok.BPETokenizer.from_file(out)
    lengths = byte_lengths(tokenizer, 640)
    assert lengths[:4].tolist() == [0, 0, 0, 0] and lengths[600:].sum() == 0
    assert lengths[4:600].min() >= 1 and lengths[tokenizer.byte_token(ord("a"))] == 1


def randomised(config: GPTConfig) -> GPT:
    torch.manual_seed(3)
    model = GPT(config).eval()
    with torch.no_grad():
        for param in model.parameters():
            param.mul_(20.0)
    return model


def test_export_carries_the_tokenizer_to_transformers_and_back(trained, tmp_path):
    pytest.importorskip("transformers")
    from transformers import AutoTokenizer, GPT2LMHeadModel

    _, out, _ = trained
    tokenizer = tok.BPETokenizer.from_file(out)
    config = GPTConfig(n_layer=2, n_head=2, n_embd=32, block_size=64, vocab_size=640)  # padded past 600
    model = randomised(config)
    exported = formats.export(model.state_dict(), config, tokenizer.to_meta(), tmp_path / "exp")
    assert "json" not in json.loads((exported / "config.json").read_text())["gpt_attention"]["tokenizer"]
    assert pretrained.load_weights(exported)[2] == tokenizer.to_meta()
    loaded, back = pretrained.load_model(exported)
    assert back.to_meta() == tokenizer.to_meta()
    prompt = back.encode("def main(x):\n    return")
    theirs = GPT2LMHeadModel.from_pretrained(exported).eval()
    idx = torch.tensor([prompt])
    out_ids = theirs.generate(idx, attention_mask=torch.ones_like(idx), max_new_tokens=12, do_sample=False)
    from gpt.inference.decoding import generate

    ours = generate(loaded, idx, 12, temperature=0.0, stop_token=0, vocab_limit=600)
    assert out_ids.tolist() == ours.tolist() and len(set(ours[0, len(prompt):].tolist())) > 2
    auto = AutoTokenizer.from_pretrained(exported)
    assert auto.decode(out_ids[0]) == back.decode(ours[0].tolist())
    native = formats.export(model.state_dict(), config, tokenizer.to_meta(), tmp_path / "native", format="native")
    assert pretrained.load_weights(native)[2] == tokenizer.to_meta()
    (exported / "tokenizer.json").write_text(json.dumps(json.loads((exported / "tokenizer.json").read_text())))
    with pytest.raises(UserError, match="not the tokenizer this model was exported with"):
        pretrained.load_weights(exported)


def damaged(spec: dict, how: str) -> str:
    """A tokenizer.json damaged in one way."""
    vocab = spec["model"]["vocab"]
    if how == "truncated":
        return json.dumps(spec)[:5000]
    if how == "wordpiece":
        spec["model"]["type"] = "WordPiece"
    elif how == "normalizer":
        spec["normalizer"] = {"type": "NFC"}
    elif how == "missing byte":  # its id given to another (new) token, so that the ids still run without a gap
        vocab["q" * 16] = vocab.pop("q")
    elif how == "id gap":
        vocab[next(iter(vocab))] = 10 ** 6
    elif how == "non-special added token":
        spec["added_tokens"][1]["special"] = False
    elif how == "dropout":
        spec["model"]["dropout"] = 0.1
    elif how == "prefix space":
        spec["pre_tokenizer"]["add_prefix_space"] = True
    elif how == "not the byte alphabet":
        last = max(vocab, key=vocab.get)
        vocab[last + "\u4e00"] = vocab.pop(last)
    elif how == "bad merge":
        spec["model"]["merges"][0] = ["no such", "token"]
    return json.dumps(spec)


DAMAGE = {"truncated": "not valid JSON", "wordpiece": "not a BPE", "normalizer": "has a normalizer",
          "missing byte": "byte 0x71 has no token", "id gap": "not 0..", "non-special added token": "is not special",
          "dropout": "dropout", "prefix space": "prefix space", "not the byte alphabet": "not spelt in the byte-level",
          "bad merge": "the tokenizers library cannot read it"}


@pytest.mark.parametrize("how", DAMAGE)
def test_a_damaged_tokenizer_json_is_refused_with_one_line(trained, tmp_path, how):
    root, out, _ = trained
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "tokenizer.json").write_text(damaged(json.loads((out / "tokenizer.json").read_text()), how))
    with pytest.raises(UserError, match=DAMAGE[how]) as err:
        prepare(DataConfig(name="x", source="path", path=str(root / "corpus"), tokenizer=str(bad),
                           root=str(tmp_path)), **QUIET)
    assert str(bad / "tokenizer.json") in str(err.value) and "\n" not in str(err.value)
    assert not (tmp_path / "x").exists()


def test_a_tampered_description_in_a_checkpoint_or_meta_json_is_refused(trained, tmp_path):
    root, out, _ = trained
    meta = tok.BPETokenizer.from_file(out).to_meta()
    config = GPTConfig(n_layer=1, n_head=2, n_embd=16, block_size=16, vocab_size=600)
    for change, message in (({"sha256": "0" * 64}, "sha256 is not that of its tokenizer.json"),
                            ({"json": meta["json"].replace('"lstrip":false', '"lstrip": false', 1)}, "sha256"),
                            ({"vocab_size": 599}, "vocab_size 599"), ({"json": "{}"}, "not a BPE")):
        checkpoint.save(checkpoint.model_entries(GPT(config).state_dict(), config, {**meta, **change}),
                        tmp_path / "ckpt.pt")
        with pytest.raises(UserError, match=message):
            pretrained.load_weights(tmp_path / "ckpt.pt")
    data_dir = prepare(DataConfig(name="m", source="path", path=str(root / "corpus"), tokenizer=str(out),
                                  root=str(tmp_path)), **QUIET)
    written = json.loads((data_dir / "meta.json").read_text())
    written["tokenizer"]["json"] = written["tokenizer"]["json"][:-10]
    (data_dir / "meta.json").write_text(json.dumps(written))
    with pytest.raises(UserError, match="meta.json: the bpe tokenizer's tokenizer.json: not valid JSON"):
        TokenData(data_dir)


@needs_gpt2
def test_gpt2_and_characters_name_their_special_tokens():
    assert tok.GPT2Tokenizer().special_tokens == {"<|endoftext|>": 50256}
    assert tok.CharTokenizer(list("ab")).special_tokens == {}
    assert not tok.has_tokens(tok.GPT2Tokenizer(), *bpe.CHAT_TOKENS)
    data = bytes(range(256)) + "✓".encode()
    gpt2 = tok.GPT2Tokenizer()
    assert tok.decode_bytes(gpt2, tok.encode_bytes(gpt2, data)) == data
