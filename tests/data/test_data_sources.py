"""Data sources: files (text, JSONL, parquet; folder or glob), Hugging Face datasets (all local), bad input."""

import json
import sys

import pytest

from conftest import needs_gpt2, run_script
from gpt.data.config import DataConfig
from gpt.data.loader import TokenData
from gpt.data.prepare import prepare
from gpt.errors import UserError

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

QUIET = dict(log=lambda *_: None)
DOCS = [f"document {i}: " + "some words here. " * (3 + i % 5) for i in range(30)]


def write_jsonl(path, texts, field="text"):
    path.write_text("".join(json.dumps({field: t, "id": i}) + "\n" for i, t in enumerate(texts)))
    return path


def write_parquet(path, texts, field="text"):
    pq.write_table(pa.table({field: texts, "id": list(range(len(texts)))}), path)
    return path


def decoded(out, split):
    data = TokenData(out)
    return data.tokenizer.decode(data.splits[split][:].tolist())


def files_cfg(tmp_path, path, **extra):
    return DataConfig(name="f", source="files", path=str(path), root=str(tmp_path / "data"), **extra)


@needs_gpt2
def test_jsonl_parquet_and_text_in_one_folder_one_document_each(tmp_path):
    folder = tmp_path / "mixed"
    folder.mkdir()
    write_jsonl(folder / "a.jsonl", DOCS[:10])
    write_parquet(folder / "b.parquet", DOCS[10:20])
    for i, text in enumerate(DOCS[20:]):
        (folder / f"c{i}.txt").write_text(text)
    out = prepare(files_cfg(tmp_path, folder, tokenizer="gpt2"), **QUIET)
    meta = json.loads((out / "meta.json").read_text())
    assert meta["source"]["documents"] == 30 and meta["dtype"] == "uint16"
    eot = "<|endoftext|>"
    assert decoded(out, "val") == "".join(DOCS[i] + eot for i in (9, 19, 29))
    assert decoded(out, "train") == "".join(DOCS[i] + eot for i in range(30) if i % 10 != 9)


@pytest.mark.parametrize("fmt", ["jsonl", "parquet"])
def test_another_text_field_and_a_glob(tmp_path, fmt):
    write = write_jsonl if fmt == "jsonl" else write_parquet
    for part in range(3):
        write(tmp_path / f"part{part}.{fmt}", DOCS[part * 10 : part * 10 + 10], field="body")
    out = prepare(files_cfg(tmp_path, tmp_path / f"part*.{fmt}", text_field="body"), **QUIET)
    assert decoded(out, "val") == "".join(DOCS[i] for i in (9, 19, 29))


def test_a_forced_format_reads_files_of_any_name(tmp_path):
    write_jsonl(tmp_path / "corpus.data", DOCS)
    out = prepare(files_cfg(tmp_path, tmp_path / "corpus.data", format="jsonl"), **QUIET)
    assert decoded(out, "val") == "".join(DOCS[i] for i in (9, 19, 29))


@pytest.mark.parametrize("content, message", [
    ('{"text": "fine"}\n{"text": "broken\n', r"bad\.jsonl:2: not valid JSON"),
    ('{"text": "fine"}\n\n{"body": "no text"}\n', r"bad\.jsonl:3: no 'text' field"),
    ('{"text": 12}\n', r"bad\.jsonl:1: the 'text' field is int, not text"),
])
def test_bad_jsonl_names_the_file_and_line(tmp_path, content, message):
    (tmp_path / "bad.jsonl").write_text(content)
    with pytest.raises(UserError, match=message):
        prepare(files_cfg(tmp_path, tmp_path / "bad.jsonl"), **QUIET)
    assert not (tmp_path / "data" / "f").exists() and not list((tmp_path / "data").glob(".*"))  # nothing half-written


def test_parquet_without_the_text_column_names_the_file_and_columns(tmp_path):
    write_parquet(tmp_path / "t.parquet", DOCS, field="content")
    with pytest.raises(UserError, match=r"t\.parquet: no column 'text' \(it has content, id\)") as err:
        prepare(files_cfg(tmp_path, tmp_path / "t.parquet"), **QUIET)
    assert "data.text_field" in err.value.hint


def test_empty_and_null_documents_are_skipped_and_counted(tmp_path):
    texts = [t if i % 4 else ("" if i % 8 else None) for i, t in enumerate(DOCS)]
    write_parquet(tmp_path / "n.parquet", texts)
    logs = []
    out = prepare(files_cfg(tmp_path, tmp_path / "n.parquet"), log=logs.append)
    meta = json.loads((out / "meta.json").read_text())
    assert meta["source"]["empty_documents"] == 8 and "skipped 8 empty document(s)" in logs[-1]


def test_undecodable_bytes_in_jsonl_are_replaced_with_a_warning(tmp_path):
    (tmp_path / "l.jsonl").write_bytes(b'{"text": "caf\xe9 au lait"}\n' * 20)
    with pytest.warns(UserWarning, match=r"l\.jsonl: 20 line\(s\) with bytes that are not UTF-8"):
        out = prepare(files_cfg(tmp_path, tmp_path / "l.jsonl"), **QUIET)
    assert "\ufffd" in decoded(out, "val")


def test_missing_optional_libraries_name_the_extra(tmp_path, monkeypatch):
    write_parquet(tmp_path / "p.parquet", DOCS)
    monkeypatch.setitem(sys.modules, "pyarrow", None)
    monkeypatch.setitem(sys.modules, "pyarrow.parquet", None)
    monkeypatch.setitem(sys.modules, "datasets", None)
    with pytest.raises(UserError, match="needs pyarrow") as err:
        prepare(files_cfg(tmp_path, tmp_path / "p.parquet"), **QUIET)
    assert '.[data]' in err.value.hint
    with pytest.raises(UserError, match="needs the Hugging Face datasets library") as err:
        prepare(DataConfig(name="h", source="hf", dataset="some/dataset", root=str(tmp_path)), **QUIET)
    assert '.[data]' in err.value.hint


@pytest.fixture
def saved_dataset(tmp_path):
    datasets = pytest.importorskip("datasets")
    folder = tmp_path / "saved"
    datasets.DatasetDict({
        "train": datasets.Dataset.from_dict({"text": DOCS, "n": list(range(30))}),
        "test": datasets.Dataset.from_dict({"text": DOCS[:12], "n": list(range(12))}),
    }).save_to_disk(str(folder))
    return folder


def test_a_saved_dataset_split_is_prepared_and_fresh_without_reloading(saved_dataset, tmp_path, monkeypatch):
    cfg = DataConfig(name="h", source="hf", dataset=str(saved_dataset), split="test", root=str(tmp_path / "data"))
    out = prepare(cfg, **QUIET)
    assert decoded(out, "val") == DOCS[9]
    assert json.loads((out / "meta.json").read_text())["source"]["documents"] == 12
    import datasets

    monkeypatch.setattr(datasets, "load_from_disk", lambda *a, **k: pytest.fail("reloaded the dataset"))
    assert prepare(cfg, **QUIET) == out


@pytest.mark.parametrize("extra, message", [
    ({"split": "validation"}, r"has no split 'validation' \(it has train, test\)"),
    ({"text_field": "body"}, r"has no column 'body' \(it has text, n\)"),
    ({"text_field": "n"}, "column 'n' holds int, not text"),
])
def test_saved_dataset_mistakes_are_one_line_errors(saved_dataset, tmp_path, extra, message):
    with pytest.raises(UserError, match=message):
        prepare(DataConfig(name="h", source="hf", dataset=str(saved_dataset), root=str(tmp_path / "d"), **extra),
                **QUIET)


@pytest.mark.slow
@needs_gpt2  # the presets are GPT-2 data: without the encoding, that is the one line they get
@pytest.mark.parametrize("preset", ["fineweb_edu", "openwebtext"])
def test_hub_presets_fail_offline_with_one_line(tmp_path, preset):
    pytest.importorskip("datasets")
    result = run_script("prepare", f"data={preset}", f"data.root={tmp_path}", env={"HF_HUB_OFFLINE": "1"})
    assert result.returncode == 2, result.stdout + result.stderr
    assert "Traceback" not in result.stderr
    line = [ln for ln in result.stderr.splitlines() if ln.startswith("error:")]
    assert line and "from the Hugging Face hub" in line[0], result.stderr
