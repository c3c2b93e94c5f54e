"""Parallel corpora as `datasets.DatasetDict`s with `source` and `target` columns, split train/validation/test.

Sources (`load_corpus` is the one entry point):

* the LibreOffice help (the default, EN-DE) and user-interface strings, from Debian's packages (`libreoffice.py`);
* **local parallel files**: a TSV (`source<TAB>target`), a JSONL (`{"source": ..., "target": ...}`, or
  `{"translation": {"en": ..., "de": ...}}`), or two line-aligned text files;
* **WMT14** through `datasets.load_dataset("wmt/wmt14", ...)` (needs the Hugging Face Hub).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

from datasets import Dataset, DatasetDict

from .errors import CorpusError
from .libreoffice import libreoffice_help_corpus, libreoffice_ui_corpus


def read_text(path: str | Path) -> str:
    """The text of a UTF-8 file. A missing file, a folder, or bytes that are not UTF-8 raise an error whose one-line
    message names the file (and the line of the first bad byte)."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"{path} does not exist; expected a UTF-8 text file.")
    if path.is_dir():
        raise IsADirectoryError(f"{path} is a folder; expected a UTF-8 text file.")
    return decode_text(path.read_bytes(), str(path))


def decode_text(data: bytes, name: str) -> str:
    """`data` decoded as UTF-8; otherwise a ValueError naming `name`, the line and the first bad byte."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as error:
        line = data.count(b"\n", 0, error.start) + 1
        raise ValueError(
            f"{name}:{line} is not UTF-8 text (byte {data[error.start]:#04x}: {error.reason}); expected a UTF-8 "
            "text file."
        ) from None


def read_parallel_file(
    path: str | Path, target_path: str | Path | None = None, source_lang: str = "en", target_lang: str = "de"
) -> Dataset:
    """Pairs from a TSV or JSONL file, or from two line-aligned text files (`path` and `target_path`).

    Bad input raises an error whose one-line message names the file, the line and what was expected there.
    """
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"Parallel data file {str(path)!r} does not exist.")
    if target_path is not None:
        pairs = _aligned_pairs(path, Path(target_path))
    elif path.suffix in (".jsonl", ".json"):
        pairs = _jsonl_pairs(path, source_lang, target_lang)
    else:
        pairs = _tsv_pairs(path)
    kept = [(source.strip(), target.strip()) for source, target in pairs if source.strip() and target.strip()]
    if not kept:
        raise CorpusError(f"{path} holds no sentence pair.")
    return Dataset.from_dict({"source": [s for s, _ in kept], "target": [t for _, t in kept]})


def _aligned_pairs(path: Path, target_path: Path) -> list[tuple[str, str]]:
    source_lines, target_lines = read_text(path).splitlines(), read_text(target_path).splitlines()
    if len(source_lines) != len(target_lines):
        raise ValueError(
            f"{path} has {len(source_lines)} lines but {target_path} has {len(target_lines)}; "
            "two aligned text files need the same number of lines."
        )
    return list(zip(source_lines, target_lines, strict=True))


def _jsonl_pairs(path: Path, source_lang: str, target_lang: str) -> Iterator[tuple[str, str]]:
    for number, line in enumerate(read_text(path).splitlines(), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as error:
            raise ValueError(
                f"{path}:{number} is not JSON ({error.msg}, column {error.colno}); expected one object per line, "
                f'{{"source": ..., "target": ...}}: {line[:200]!r}'
            ) from None
        if not isinstance(record, dict):
            raise ValueError(
                f"{path}:{number} holds a JSON {type(record).__name__}; expected one object per line, "
                f'{{"source": ..., "target": ...}}: {line[:200]!r}'
            )
        if isinstance(record.get("translation"), dict):
            record = {
                "source": record["translation"].get(source_lang),
                "target": record["translation"].get(target_lang),
            }
        if not isinstance(record.get("source"), str) or not isinstance(record.get("target"), str):
            raise ValueError(
                f"{path}:{number} has no string 'source' and 'target' (or translation.{source_lang} and "
                f"translation.{target_lang}): {line[:200]!r}"
            )
        yield record["source"], record["target"]


def _tsv_pairs(path: Path) -> Iterator[tuple[str, str]]:
    for number, line in enumerate(read_text(path).splitlines(), 1):
        if not line.strip():
            continue
        fields = line.split("\t")
        if len(fields) != 2:
            raise ValueError(
                f"{path}:{number} has {len(fields)} tab-separated fields; a TSV needs exactly 2 "
                f"(source<TAB>target): {line[:200]!r}"
            )
        yield fields[0], fields[1]


def parallel_files_corpus(train: str, validation: str | None = None, test: str | None = None, **kwargs) -> DatasetDict:
    """A corpus from local files. `train` may be `src.txt,tgt.txt` for two aligned files; so may the others."""

    def load(spec: str) -> Dataset:
        parts = spec.split(",")
        if len(parts) > 2:
            raise ValueError(f"{spec!r}: give one file, or two comma-separated aligned text files.")
        return read_parallel_file(parts[0], parts[1] if len(parts) == 2 else None, **kwargs)

    corpus = {"train": load(train)}
    for name, spec in (("validation", validation), ("test", test)):
        if spec:
            corpus[name] = load(spec)
    return DatasetDict(corpus)


def wmt_to_pairs(dataset: Dataset, source_lang: str, target_lang: str) -> Dataset:
    """WMT's `{"translation": {"de": ..., "en": ...}}` rows as `source`/`target` columns."""

    def convert(batch):
        return {
            "source": [pair[source_lang] for pair in batch["translation"]],
            "target": [pair[target_lang] for pair in batch["translation"]],
        }

    return dataset.map(convert, batched=True, remove_columns=dataset.column_names)


def wmt14_corpus(source_lang: str = "en", target_lang: str = "de") -> DatasetDict:
    """WMT14 (the paper's data, §5.1) from the Hugging Face Hub: newstest2013 validation, newstest2014 test."""
    import datasets

    pair = "-".join(sorted((source_lang, target_lang), key=lambda lang: lang == "en"))  # "de-en", "fr-en"
    try:
        raw = datasets.load_dataset("wmt/wmt14", pair)
    except Exception as error:  # no network, no Hub, or an unknown pair
        raise CorpusError(
            f"Could not load WMT14 {pair} from the Hugging Face Hub ({type(error).__name__}: {error}). "
            "It needs network access to the Hub; without it, use the default LibreOffice corpus or --data_files."
        ) from error
    return DatasetDict({split: wmt_to_pairs(raw[split], source_lang, target_lang) for split in raw})


def load_corpus(
    dataset: str = "libreoffice-help",
    source_lang: str = "en",
    target_lang: str = "de",
    data_files: str | None = None,
    validation_files: str | None = None,
    test_files: str | None = None,
    cache_dir: str | Path | None = None,
) -> DatasetDict:
    """One entry point for every source: `libreoffice-help` (default), `libreoffice-ui`, `wmt14`, or local files."""
    if data_files:
        return parallel_files_corpus(
            data_files, validation_files, test_files, source_lang=source_lang, target_lang=target_lang
        )
    if dataset == "libreoffice-help":
        return libreoffice_help_corpus(source_lang, target_lang, cache_dir)
    if dataset == "libreoffice-ui":
        return libreoffice_ui_corpus(target_lang, cache_dir)
    if dataset == "wmt14":
        return wmt14_corpus(source_lang, target_lang)
    raise ValueError(
        f"dataset={dataset!r} is unknown; expected 'libreoffice-help', 'libreoffice-ui', 'wmt14', "
        "or --data_files for local files."
    )
