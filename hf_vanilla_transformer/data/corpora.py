"""Parallel corpora as `datasets.DatasetDict`s with `source` and `target` columns, split train/validation/test, in
memory-mapped Arrow files on disk: a corpus of millions of pairs costs the page cache, not the process's memory.

Sources (`load_corpus` is the one entry point):

* the LibreOffice help (the default, EN-DE), its user-interface strings, and the two together, from Debian's packages
  (`libreoffice.py`);
* **local parallel files**: a TSV (`source<TAB>target`), a JSONL (`{"source": ..., "target": ...}`, or
  `{"translation": {"en": ..., "de": ...}}`), or two line-aligned text files; read line by line into Arrow once per
  machine, cached under a key of their content (`cache.py`);
* **WMT14** (the paper's data): the Hub's `wmt/wmt14`, or a local copy of its parquet files (`wmt14_dir`: the
  folder `hf download wmt/wmt14 --repo-type dataset --include "de-en/*" --local-dir DIR` writes), offline.

`hold_out` carves validation and test pairs out of a training split that comes without them (a run on one file).
"""

from __future__ import annotations

import json
import logging
import os
from collections import Counter
from collections.abc import Iterable, Iterator
from pathlib import Path

import numpy as np
import pyarrow as pa
from datasets import Dataset, DatasetDict, Features, Value
from datasets.arrow_writer import ArrowWriter

from ..utils.faults import moment
from ..utils.machine import release_mapped_pages
from .cache import building, cache_root, complete_folder, entry_lock, files_key, open_arrow
from .libreoffice import libreoffice_help_corpus, libreoffice_help_ui_corpus, libreoffice_ui_corpus
from .splits import SPLITS, CorpusError, DataFileError
from .text_files import LONGEST_LINE, LONGEST_SIDE, text_lines


logger = logging.getLogger(__name__)

PAIR_FEATURES = Features({"source": Value("string"), "target": Value("string")})
# Pairs per Arrow record batch. A process that opens the file reads every batch's header through the memory map,
# and the system maps the pages around each page read (a large folio at a time): with `datasets`' 1,000-pair
# batches that was 0.17 GB of a 1.1 GB corpus, with these a few MB.
WRITE_BATCH = 50_000
LAYOUT = "corpus-2"  # in the cache key: a corpus cached in another layout is written again
# Lines of a parallel file that are no sentence pair: left out and counted (`parallel_pairs`).
SKIPPED = {  # (a line is read with a bound, text_files.py: a longer one is skipped unread)
    "empty": "an empty source or target",
    "nul": "a NUL byte",
    "long": f"a side longer than {LONGEST_SIDE:,} characters (or a line longer than {LONGEST_LINE:,} bytes)",
}
SKIPPED_FILE = "skipped.json"  # in a corpus's cache folder: {split: {reason: lines}}

# Held out of a training file that comes without validation or test pairs: this many pairs for each, at most this
# fraction of the file, drawn with this seed (the same pairs whatever the run's seed, so runs compare).
HELD_OUT_PAIRS, HELD_OUT_FRACTION, HELD_OUT_SEED = 1000, 0.05, 0


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
    """`data` decoded as UTF-8; otherwise a DataFileError naming `name`, the line and the first bad byte."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as error:
        line = data.count(b"\n", 0, error.start) + 1
        raise DataFileError(
            f"{name}:{line} is not UTF-8 text (byte {data[error.start]:#04x}: {error.reason}); expected a UTF-8 "
            "text file."
        ) from None


def read_parallel_file(
    path: str | Path, target_path: str | Path | None = None, source_lang: str = "en", target_lang: str = "de"
) -> Dataset:
    """Pairs from a TSV or JSONL file, or from two line-aligned text files (`path` and `target_path`), in memory
    (`parallel_files_corpus` writes large files to Arrow instead).

    Bad input raises an error whose one-line message names the file, the line and what was expected there.
    """
    pairs = list(parallel_pairs(path, target_path, source_lang, target_lang))
    if not pairs:
        raise CorpusError(f"{path} holds no sentence pair.")
    return Dataset.from_dict({"source": [s for s, _ in pairs], "target": [t for _, t in pairs]}, features=PAIR_FEATURES)


def parallel_pairs(
    path: str | Path,
    target_path: str | Path | None = None,
    source_lang: str = "en",
    target_lang: str = "de",
    skipped: Counter | None = None,
) -> Iterator[tuple[str, str]]:
    """The (source, target) pairs of a file (see `read_parallel_file`), read line by line, stripped. A pair that is
    no sentence pair is left out and counted in `skipped` by reason (`SKIPPED`): an empty side, a NUL byte, a side
    longer than `LONGEST_SIDE` characters, a line longer than `LONGEST_LINE` bytes (skipped unread). What breaks the
    file's format (bytes that are not UTF-8, a line that is no TSV or JSONL record, JSON nested too deep to read, two
    files of different lengths) refuses the whole file, naming it and the line."""
    path = _check_file(path)
    if target_path is not None:
        pairs = _aligned_pairs(path, _check_file(target_path))
    elif path.suffix in (".jsonl", ".json"):
        pairs = _jsonl_pairs(path, source_lang, target_lang)
    else:
        pairs = _tsv_pairs(path)
    skipped = Counter() if skipped is None else skipped
    for source, target in pairs:
        if source is None or target is None:  # a line too long to read (`text_files.LONGEST_LINE`)
            skipped[SKIPPED["long"]] += 1
            continue
        source, target = source.strip(), target.strip()
        if not source or not target:
            skipped[SKIPPED["empty"]] += 1
        elif "\x00" in source or "\x00" in target:
            skipped[SKIPPED["nul"]] += 1
        elif len(source) > LONGEST_SIDE or len(target) > LONGEST_SIDE:
            skipped[SKIPPED["long"]] += 1
        else:
            yield source, target


def _check_file(path: str | Path) -> Path:
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"Parallel data file {str(path)!r} does not exist.")
    if path.is_dir():
        raise IsADirectoryError(f"{path} is a folder; expected a UTF-8 text file.")
    return path


def _aligned_pairs(path: Path, target_path: Path) -> Iterator[tuple[str, str]]:
    sources, targets = text_lines(path), text_lines(target_path)
    counts = [0, 0]
    while True:
        source, target = next(sources, None), next(targets, None)
        counts = [counts[0] + (source is not None), counts[1] + (target is not None)]
        if source is None or target is None:
            break
        yield source[1], target[1]
    counts = [counts[0] + sum(1 for _ in sources), counts[1] + sum(1 for _ in targets)]
    if counts[0] != counts[1]:
        raise DataFileError(
            f"{path} has {counts[0]} lines but {target_path} has {counts[1]}; two aligned text files need the same "
            "number of lines."
        )


def _jsonl_pairs(path: Path, source_lang: str, target_lang: str) -> Iterator[tuple[str, str]]:
    for number, line in text_lines(path):
        if line is None:  # too long to read: counted (`parallel_pairs`)
            yield None, None
        if line is None or not line.strip():
            continue
        try:
            record = json.loads(line)
        except (json.JSONDecodeError, RecursionError) as error:
            what = (
                f"{error.msg}, column {error.colno}" if isinstance(error, json.JSONDecodeError) else "nested too deep"
            )
            raise DataFileError(
                f"{path}:{number} is not JSON ({what}); expected one object per line, "
                f'{{"source": ..., "target": ...}}: {line[:200]!r}'
            ) from None
        if not isinstance(record, dict):
            raise DataFileError(
                f"{path}:{number} holds a JSON {type(record).__name__}; expected one object per line, "
                f'{{"source": ..., "target": ...}}: {line[:200]!r}'
            )
        if isinstance(record.get("translation"), dict):
            record = {
                "source": record["translation"].get(source_lang),
                "target": record["translation"].get(target_lang),
            }
        if not isinstance(record.get("source"), str) or not isinstance(record.get("target"), str):
            raise DataFileError(
                f"{path}:{number} has no string 'source' and 'target' (or translation.{source_lang} and "
                f"translation.{target_lang}): {line[:200]!r}"
            )
        yield record["source"], record["target"]


def _tsv_pairs(path: Path) -> Iterator[tuple[str, str]]:
    for number, line in text_lines(path):
        if line is None:  # too long to read: counted (`parallel_pairs`)
            yield None, None
        if line is None or not line.strip():
            continue
        fields = line.split("\t")
        if len(fields) != 2:
            raise DataFileError(
                f"{path}:{number} has {len(fields)} tab-separated fields; a TSV needs exactly 2 "
                f"(source<TAB>target): {line[:200]!r}"
            )
        yield fields[0], fields[1]


def write_pairs(pairs: Iterable[tuple[str, str]], path: Path) -> int:
    """Write `pairs` to the Arrow file `path` in record batches (memory stays flat); returns how many."""
    writer = ArrowWriter(features=PAIR_FEATURES, path=str(path), writer_batch_size=WRITE_BATCH)
    count, sources, targets = 0, [], []
    for source, target in pairs:
        sources.append(source)
        targets.append(target)
        if len(sources) == WRITE_BATCH:
            writer.write_batch({"source": sources, "target": targets})
            count, sources, targets = count + len(sources), [], []
    if sources:
        writer.write_batch({"source": sources, "target": targets})
        count += len(sources)
    writer.finalize()
    return count


def parallel_files_corpus(
    train: str,
    validation: str | None = None,
    test: str | None = None,
    source_lang: str = "en",
    target_lang: str = "de",
    cache_dir: str | Path | None = None,
    carve: bool = False,
) -> DatasetDict:
    """A corpus from local files, read into memory-mapped Arrow once and cached under a key of their content (a
    second call, or another process, reads the cache). `train` may be `src.txt,tgt.txt` for two aligned files; so
    may the others. With `carve` (training), the validation and test splits not given are carved out of the
    training file as it is cached (`hold_out_files`); without, the training split is every pair of its file."""
    specs = {name: _file_spec(spec) for name, spec in (("train", train), ("validation", validation), ("test", test))}
    specs = {name: spec for name, spec in specs.items() if spec}
    paths = [_check_file(path) for spec in specs.values() for path in spec]
    names = {name: [str(p) for p in spec] for name, spec in specs.items()}
    missing = [split for split in SPLITS if split not in specs] if carve and "train" in specs else []
    held_out = [(HELD_OUT_PAIRS, HELD_OUT_FRACTION, HELD_OUT_SEED)] if missing else []
    key = files_key(paths, names, source_lang, target_lang, LAYOUT, *held_out, cache_dir=cache_dir)
    folder = cache_root(cache_dir) / "corpora" / key
    with entry_lock(folder, cache_dir):
        if complete_folder(folder) is None:
            with building(folder) as temporary:
                skipped = {}
                for name, spec in specs.items():
                    counts = Counter()
                    second = spec[1] if len(spec) == 2 else None
                    pairs = parallel_pairs(spec[0], second, source_lang, target_lang, counts)
                    if write_pairs(pairs, temporary / f"{name}.arrow") == 0:
                        raise CorpusError(f"{spec[0]} holds no sentence pair ({_described(counts) or 'it is empty'}).")
                    skipped[name] = {"file": spec[0], "lines": dict(counts)}
                    moment("corpus", temporary)
                if missing:
                    hold_out_files(temporary, missing)
                (temporary / SKIPPED_FILE).write_text(json.dumps(skipped, indent=1) + "\n", encoding="utf-8")
    splits = [name for name in SPLITS if (folder / f"{name}.arrow").exists()]
    corpus = DatasetDict({name: open_arrow(folder / f"{name}.arrow") for name in splits})
    corpus.skipped_lines = _skipped_lines(folder)
    return corpus


def _skipped_lines(folder: Path) -> dict:
    """The lines of each split's file left out when it was read (`SKIPPED_FILE`), said in the log."""
    path = folder / SKIPPED_FILE
    skipped = json.loads(path.read_text(encoding="utf-8")) if path.exists() else {}
    for split in skipped.values():
        if split["lines"]:
            logger.warning("%s: left out %s", split["file"], _described(split["lines"]))
    return skipped


def _described(counts: dict) -> str:
    return ", ".join(f"{count:,} line{'s' if count != 1 else ''} with {reason}" for reason, count in counts.items())


def _file_spec(spec: str | None) -> list[str] | None:
    if not spec:
        return None
    parts = spec.split(",")
    if len(parts) > 2:
        raise ValueError(f"{spec!r}: give one file, or two comma-separated aligned text files.")
    return parts


def hold_out(corpus: DatasetDict, pairs: int = HELD_OUT_PAIRS, fraction: float = HELD_OUT_FRACTION) -> DatasetDict:
    """`corpus` with the validation and test splits it lacks carved out of its training split: `pairs` pairs each
    (at most `fraction` of the split, at least 1), drawn with the fixed seed `HELD_OUT_SEED`, and removed from
    training. A corpus that has both splits comes back as it is. (Local files are carved as they are read into the
    cache, `hold_out_files`: the training split stays a file, without an index of its rows in every process.)"""
    missing = [split for split in ("validation", "test") if split not in corpus]
    if not missing:
        return corpus
    train = corpus["train"]
    chosen = held_out_rows(len(train), missing, pairs, fraction)
    carved = dict(corpus)
    for split, rows in zip(missing, chosen, strict=True):
        carved[split] = train.select(rows, keep_in_memory=True)
    carved["train"] = train.select(np.setdiff1d(np.arange(len(train)), np.concatenate(chosen)), keep_in_memory=True)
    return DatasetDict({split: carved[split] for split in SPLITS})


def held_out_size(rows: int, splits: int, pairs: int = HELD_OUT_PAIRS, fraction: float = HELD_OUT_FRACTION):
    """The pairs held out for each of `splits` splits of a training split of `rows` pairs (`pairs`, at most `fraction`
    of it, at least 1), or None where that would leave training fewer pairs than are held out."""
    size = min(pairs, max(1, int(rows * fraction)))
    return size if rows >= 2 * size * splits else None


def held_out_rows(rows: int, missing: list[str], pairs: int = HELD_OUT_PAIRS, fraction: float = HELD_OUT_FRACTION):
    """The rows of a training split of `rows` pairs held out for each split of `missing` (sorted), as `hold_out`
    draws them; said in the log."""
    size = held_out_size(rows, len(missing), pairs, fraction)
    if size is None:
        raise CorpusError(
            f"The training file has {rows} pairs: too few to hold out {' and '.join(missing)} pairs and still "
            "train; give --validation_files and --test_files."
        )
    chosen = np.random.default_rng(HELD_OUT_SEED).choice(rows, size * len(missing), replace=False)
    logger.info(
        "no %s pairs given: %s held out of the %d training pairs (seed %d)",
        " or ".join(missing),
        " and ".join(f"{size:,} for {split}" for split in missing),
        rows,
        HELD_OUT_SEED,
    )
    return [np.sort(chosen[index * size : (index + 1) * size]) for index in range(len(missing))]


def hold_out_files(folder: Path, missing: list[str]) -> None:
    """Carve the `missing` held-out splits out of `folder/train.arrow` as `hold_out` would, into Arrow files beside
    it, and write the training split again without them, a record batch at a time (the corpus pages read are
    unmapped as it goes: `release_mapped_pages`). A file too small to carve is left whole (`hold_out` says why)."""
    train = open_arrow(folder / "train.arrow")
    if held_out_size(len(train), len(missing)) is None:
        return
    chosen = held_out_rows(len(train), missing)
    for split, rows in zip(missing, chosen, strict=True):
        held = train[rows]
        write_pairs(zip(held["source"], held["target"], strict=True), folder / f"{split}.arrow")
        release_mapped_pages()
    dropped = np.concatenate(chosen)
    writer = ArrowWriter(features=PAIR_FEATURES, path=str(folder / "train-kept.arrow"), writer_batch_size=WRITE_BATCH)
    start = 0
    for batch in train.data.to_batches():
        rows = dropped[(dropped >= start) & (dropped < start + batch.num_rows)] - start
        writer.write_table(pa.Table.from_batches([batch.filter(~np.isin(np.arange(batch.num_rows), rows))]))
        start += batch.num_rows
        release_mapped_pages()
    writer.finalize()
    del train
    os.replace(folder / "train-kept.arrow", folder / "train.arrow")


def wmt_to_pairs(dataset: Dataset, source_lang: str, target_lang: str) -> Dataset:
    """WMT's `{"translation": {"de": ..., "en": ...}}` rows as `source`/`target` columns: the struct's fields as
    columns of the same memory-mapped table (no pass over the rows)."""
    flat = dataset.flatten()
    names = {f"translation.{source_lang}": "source", f"translation.{target_lang}": "target"}
    missing = sorted(set(names) - set(flat.column_names))
    if missing:
        raise CorpusError(f"WMT rows hold {flat.column_names}, not {missing}: is the language pair right?")
    return flat.select_columns(list(names)).rename_columns(names)


def wmt14_corpus(
    source_lang: str = "en", target_lang: str = "de", wmt14_dir: str | Path | None = None, cache_dir=None
) -> DatasetDict:
    """WMT14 (the paper's data, §5.1): newstest2013 validation, newstest2014 test. From the Hugging Face Hub, or
    from `wmt14_dir`, a local copy of the Hub's parquet files (`<dir>/de-en/train-*.parquet`, ... or the files of
    one pair directly in `<dir>`), converted to Arrow once in the data cache."""
    import datasets

    pair = "-".join(sorted((source_lang, target_lang), key=lambda lang: lang == "en"))  # "de-en", "fr-en"
    hub_cache = cache_root(cache_dir) / "wmt14"
    if wmt14_dir is not None:
        files = wmt14_files(Path(wmt14_dir), pair)
        raw = datasets.load_dataset("parquet", data_files=files, cache_dir=str(hub_cache))
    else:
        try:
            raw = datasets.load_dataset("wmt/wmt14", pair, cache_dir=str(hub_cache))
        except Exception as error:  # no network, no Hub, or an unknown pair
            raise CorpusError(
                f"Could not load WMT14 {pair} from the Hugging Face Hub ({type(error).__name__}: {error}). It needs "
                "network access to the Hub; without it, give a local copy of its parquet files (--wmt14_dir), use the "
                "default LibreOffice corpus or --data_files."
            ) from error
    return DatasetDict({split: wmt_to_pairs(raw[split], source_lang, target_lang) for split in raw})


def wmt14_files(folder: Path, pair: str) -> dict[str, list[str]]:
    """{split: parquet files} of a local copy of `wmt/wmt14` for `pair`; a ValueError says what is missing."""
    root = folder / pair if (folder / pair).is_dir() else folder
    files = {split: sorted(str(path) for path in root.glob(f"{split}-*.parquet")) for split in SPLITS}
    missing = [split for split, found in files.items() if not found]
    if missing:
        raise ValueError(
            f"wmt14_dir={str(folder)!r} holds no {', '.join(missing)} parquet files for {pair} (looked for "
            f"{root}/<split>-*.parquet); expected a copy of the Hub's wmt/wmt14, e.g. `hf download wmt/wmt14 "
            f'--repo-type dataset --include "{pair}/*" --local-dir {folder}`.'
        )
    return files


def load_corpus(
    dataset: str = "libreoffice-help",
    source_lang: str = "en",
    target_lang: str = "de",
    data_files: str | None = None,
    validation_files: str | None = None,
    test_files: str | None = None,
    cache_dir: str | Path | None = None,
    wmt14_dir: str | Path | None = None,
    carve: bool = False,
) -> DatasetDict:
    """One entry point for every source: `libreoffice-help` (default), `libreoffice-ui`, `libreoffice-help-ui` (the
    help with the UI strings' training messages: the CPU recipe's), `debian-messages` (command-line tools' messages:
    a domain far from the help), `wmt14` (from the Hub, or
    from `wmt14_dir`), or local files (with `carve`, the held-out splits not given carved out of the training file
    as it is cached: see `parallel_files_corpus`)."""
    if data_files:
        return parallel_files_corpus(
            data_files,
            validation_files,
            test_files,
            source_lang=source_lang,
            target_lang=target_lang,
            cache_dir=cache_dir,
            carve=carve,
        )
    if dataset == "libreoffice-help":
        return libreoffice_help_corpus(source_lang, target_lang, cache_dir)
    if dataset == "libreoffice-ui":
        return libreoffice_ui_corpus(target_lang, cache_dir)
    if dataset == "libreoffice-help-ui":
        return libreoffice_help_ui_corpus(source_lang, target_lang, cache_dir)
    if dataset == "debian-messages":
        from .debian_messages import debian_messages_corpus

        return debian_messages_corpus(source_lang, target_lang, cache_dir)
    if dataset == "wmt14":
        return wmt14_corpus(source_lang, target_lang, wmt14_dir, cache_dir)
    raise ValueError(
        f"dataset={dataset!r} is unknown; expected 'libreoffice-help', 'libreoffice-ui', 'libreoffice-help-ui', "
        "'debian-messages', 'wmt14', or --data_files for local files."
    )
