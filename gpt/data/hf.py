"""Hugging Face ``datasets`` as a Source: a hub dataset (downloaded or streamed) or a folder written by save_to_disk.

Freshness needs no network: a hub dataset is identified by its name, subset, split and revision (a new
upload under the same revision is not noticed; data.rebuild=true re-prepares), a local folder by its
files' sizes and modification times.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

from gpt.data.config import DataConfig
from gpt.data.formats import import_datasets
from gpt.data.sources import Source, file_entries
from gpt.errors import UserError
from gpt.validate import Record, read_json

BATCH_ROWS = 1000


def hf_source(cfg: DataConfig) -> Source:
    """The documents of ``cfg.dataset`` (hub name or local save_to_disk folder), column ``cfg.text_field``."""
    if not cfg.dataset:
        raise UserError("data.dataset is not set", hint="pass data.dataset=<hub name or a save_to_disk folder>")
    local = Path(cfg.dataset).expanduser()
    what = f"{cfg.dataset}" + (f" ({cfg.subset})" if cfg.subset else "") + f", split {cfg.split}"
    if local.is_dir():
        files = sorted(p for p in local.rglob("*") if p.is_file())
        manifest: dict[str, Any] = {"kind": "hf-disk", "root": str(local.resolve()),
                                    "files": file_entries(files, local)}
        read = lambda: rows(open_local(local, cfg.split), cfg.text_field, what)  # noqa: E731
    else:
        import_datasets()  # say now, not at the first document, that the library is missing
        manifest = {"kind": "hf-hub", "dataset": cfg.dataset, "subset": cfg.subset, "revision": cfg.revision}
        read = lambda: rows(open_hub(cfg), cfg.text_field, what)  # noqa: E731
    manifest.update(split=cfg.split, text_field=cfg.text_field)
    return Source("hf", f"Hugging Face dataset {what}", manifest, read)


SAVED_HINT = "the folder is damaged or was not written by save_to_disk: save the dataset again"


def check_saved(folder: Path, nested: bool = False) -> None:
    """The JSON files ``save_to_disk`` writes, read with gpt.validate's limits before ``datasets`` trusts them:
    dataset_dict.json's splits and state.json's data files must be plain names inside the folder (a name like
    ../other/data.arrow would read a file from elsewhere), dataset_info.json an object."""
    def plain(name: str, record: Record, field: str) -> None:
        if name != Path(name).name or name in (".", ".."):
            raise record.error(f"{field} must name a file or folder inside {folder}, got {name!r}")

    if not nested and (folder / "dataset_dict.json").is_file():
        index = Record(read_json(folder / "dataset_dict.json", SAVED_HINT), str(folder / "dataset_dict.json"),
                       SAVED_HINT)
        for i, split in enumerate(index.list("splits", of=str, nonempty=True)):
            plain(split, index, f"splits[{i}]")
            check_saved(folder / split, nested=True)
        return
    if not (folder / "state.json").is_file():
        return  # not a save_to_disk folder at all: load_from_disk says so
    Record(read_json(folder / "dataset_info.json", SAVED_HINT), str(folder / "dataset_info.json"), SAVED_HINT)
    state = Record(read_json(folder / "state.json", SAVED_HINT), str(folder / "state.json"), SAVED_HINT)
    for i, entry in enumerate(state.list("_data_files", of=dict, nonempty=True)):
        plain(Record(entry, state.where, SAVED_HINT, f"_data_files[{i}]").str("filename"), state,
              f"_data_files[{i}].filename")


def open_local(folder: Path, split: str):
    """The split ``split`` of a dataset folder written by ``save_to_disk`` (a Dataset or a DatasetDict)."""
    datasets = import_datasets()
    check_saved(folder)
    try:
        loaded = datasets.load_from_disk(str(folder))
    except Exception as err:  # damaged arrow or JSON files: datasets and pyarrow raise many unrelated types
        first = (str(err).strip().splitlines() or [type(err).__name__])[0][:200]
        raise UserError(f"{folder} is not a readable dataset folder written by save_to_disk ({first})",
                        hint="point data.dataset at a save_to_disk folder or a hub name") from None
    if isinstance(loaded, datasets.DatasetDict):
        if split not in loaded:
            raise UserError(f"{folder} has no split {split!r} (it has {', '.join(loaded)})",
                            hint="pass data.split=<one of them>")
        return loaded[split]
    return loaded


def open_hub(cfg: DataConfig):
    """``datasets.load_dataset`` of the configured hub dataset, or a one-line UserError when it cannot be reached."""
    datasets = import_datasets()
    try:
        return datasets.load_dataset(cfg.dataset, cfg.subset, split=cfg.split, streaming=cfg.streaming,
                                     revision=cfg.revision)
    except Exception as err:  # offline, unknown name, gated: datasets raises many unrelated types
        first = (str(err).strip().splitlines() or [type(err).__name__])[0][:300]
        raise UserError(
            f"could not load {cfg.dataset} from the Hugging Face hub ({type(err).__name__}: {first})",
            hint="it needs the network (or a filled Hugging Face cache); offline, prepare it where the hub is "
                 "reachable, or save_to_disk a copy and pass data.dataset=<that folder>",
        ) from None


def rows(dataset, text_field: str, what: str) -> Iterator[str]:
    """The ``text_field`` of every row, read BATCH_ROWS rows at a time ("" for a null)."""
    names = dataset.column_names
    if names is not None and text_field not in names:
        raise UserError(f"{what} has no column {text_field!r} (it has {', '.join(names)})",
                        hint="set data.text_field=<the column that holds the text>")
    batches = dataset.iter(batch_size=BATCH_ROWS)
    while True:
        try:  # a damaged file or a dropped connection shows only when its rows are read
            batch = next(batches)
        except StopIteration:
            return
        except Exception as err:
            first = (str(err).strip().splitlines() or [type(err).__name__])[0][:200]
            raise UserError(f"{what}: its rows could not be read ({type(err).__name__}: {first})",
                            hint="a local folder is damaged (save it again); a hub dataset needs the network") from None
        for value in batch[text_field]:
            if value is not None and not isinstance(value, str):
                raise UserError(f"{what}: column {text_field!r} holds {type(value).__name__}, not text",
                                hint="set data.text_field=<a column of strings>")
            yield value or ""
