"""Parallel corpora as `datasets.DatasetDict`s with `source` and `target` columns, split train/validation/test.

Sources:

* **LibreOffice help** (the default, EN-DE): Debian's `libreoffice-help-en-us` and `libreoffice-help-<lang>` ship
  the same help pages in many languages, paragraph by paragraph, with the same file paths and element ids, so
  pairs align exactly. The packages are fetched with `apt-get download` and unpacked with `dpkg-deb -x`;
  LibreOffice itself is never installed and no Debian version is pinned.
* **LibreOffice UI strings** (`libreoffice-l10n-<lang>`): the gettext catalogues of the user interface, short
  strings of a second domain, handy for fine-tuning.
* **Local parallel files**: a TSV (`source<TAB>target`), a JSONL (`{"source": ..., "target": ...}`, or
  `{"translation": {"en": ..., "de": ...}}`), or two line-aligned text files.
* **WMT14** through `datasets.load_dataset("wmt/wmt14", ...)` (needs the Hugging Face Hub).

The split of the LibreOffice corpora is by file, never by pair (the same paragraph recurs on many pages), with a
fixed rule: the CRC-32 of a help file's path (relative to its language folder) modulo 100 puts the file in
*test* when it is below 3, in *validation* when below 5, in *train* otherwise. Pairs are de-duplicated, and a
validation or test pair whose source sentence also occurs in an earlier split is dropped, so that nothing held
out was seen in training.
"""

from __future__ import annotations

import gettext
import html
import json
import logging
import os
import re
import shutil
import subprocess
import tempfile
import zlib
from collections.abc import Iterable, Iterator
from html.parser import HTMLParser
from pathlib import Path

from datasets import Dataset, DatasetDict, load_from_disk


logger = logging.getLogger(__name__)

SPLITS = ("train", "validation", "test")
TEST_BELOW, VALIDATION_BELOW = 3, 5  # CRC-32(path) % 100 thresholds of the file-level split
UNIT_ID = re.compile(r"^(par|hd)_id")
DEFAULT_CACHE = Path(os.environ.get("HF_VANILLA_TRANSFORMER_DATA", Path.home() / ".cache" / "hf_vanilla_transformer"))


class CorpusError(RuntimeError):
    """A corpus cannot be built here; the message says what to run or which source to use instead."""


# ---------------------------------------------------------------------------------------------------------------------
# Debian packages
# ---------------------------------------------------------------------------------------------------------------------


def debian_language(lang: str) -> tuple[str, str]:
    """(package suffix, help folder) of a language code: 'de' -> ('de', 'de'), 'pt-BR' -> ('pt-br', 'pt-BR')."""
    parts = re.split(r"[-_]", lang.strip())
    if not parts[0] or not all(part.isalnum() for part in parts):
        raise ValueError(f"Language code {lang!r} is not of the form 'de', 'fr' or 'pt-BR'.")
    folder = parts[0].lower() + "".join("-" + part.upper() for part in parts[1:])
    return folder.lower(), folder


def fetch_debian_package(package: str, cache_dir: Path) -> Path:
    """Download `package`'s .deb with `apt-get download` (once; later calls reuse it) and unpack it.

    Returns the folder the package was unpacked into. Runs `apt-get update` once if the package is unknown.
    """
    unpacked = cache_dir / "debs" / package
    if (unpacked / ".complete").exists():
        return unpacked
    if shutil.which("apt-get") is None or shutil.which("dpkg-deb") is None:
        raise CorpusError(
            f"Cannot fetch the Debian package {package}: apt-get and dpkg-deb are not available on this machine. "
            "The LibreOffice corpora come from Debian packages; elsewhere use your own parallel files "
            "(--data_files train.tsv) or WMT14 (--dataset wmt14)."
        )
    with tempfile.TemporaryDirectory(dir=cache_dir) as tmp:
        for attempt in range(2):
            result = subprocess.run(["apt-get", "download", package], cwd=tmp, capture_output=True, text=True)
            if result.returncode == 0:
                break
            if attempt == 0 and "Unable to locate package" in result.stderr:
                logger.info("apt-get does not know %s yet; running apt-get update", package)
                update = subprocess.run(["apt-get", "update"], capture_output=True, text=True)
                if update.returncode != 0:
                    raise CorpusError(
                        f"`apt-get update` failed ({update.stderr.strip()[-300:]}); run it yourself (with sudo "
                        "if needed), then try again."
                    )
                continue
            raise CorpusError(
                f"`apt-get download {package}` failed: {result.stderr.strip()[-500:]}\n"
                f"Check the name with `apt-cache search {package.rsplit('-', 1)[0]}`; a language without a "
                "LibreOffice package cannot be used, pick another one or use --data_files."
            )
        debs = sorted(Path(tmp).glob("*.deb"))
        if not debs:
            raise CorpusError(f"`apt-get download {package}` left no .deb file in {tmp}.")
        target = Path(tmp) / "unpacked"
        subprocess.run(["dpkg-deb", "-x", str(debs[0]), str(target)], check=True, capture_output=True)
        if unpacked.exists():
            shutil.rmtree(unpacked)
        unpacked.parent.mkdir(parents=True, exist_ok=True)
        target.rename(unpacked)
    (unpacked / ".complete").write_text(debs[0].name + "\n")
    return unpacked


# ---------------------------------------------------------------------------------------------------------------------
# LibreOffice help pages
# ---------------------------------------------------------------------------------------------------------------------


class _HelpUnitParser(HTMLParser):
    """Collects the text of every element whose id starts with `par_id` or `hd_id`, hidden spans left out."""

    VOID = {"br", "img", "meta", "link", "input", "hr", "area", "base", "col", "embed", "source", "wbr"}

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.units: list[tuple[str, str]] = []
        self._open: list[tuple[str, str | None, list[str]]] = []  # (tag, unit id or None, text parts)
        self._hidden_depth = 0  # > 0 while inside <span hidden="true">

    def handle_starttag(self, tag, attrs):
        if tag in self.VOID:
            if tag == "br":
                self.handle_data(" ")
            return
        attributes = dict(attrs)
        if self._hidden_depth or attributes.get("hidden") is not None:
            self._hidden_depth += 1
        unit = attributes.get("id")
        self._open.append((tag, unit if unit and UNIT_ID.match(unit) else None, []))

    def handle_endtag(self, tag):
        if tag in self.VOID:
            return
        # Close up to the matching tag (the help pages are well-formed; this also survives stray end tags).
        while self._open:
            open_tag, unit, parts = self._open.pop()
            if self._hidden_depth:
                self._hidden_depth -= 1
            if unit is not None:
                text = " ".join("".join(parts).split())
                if text:
                    self.units.append((unit, text))
            elif self._open and parts:
                self._open[-1][2].extend(parts)
            if open_tag == tag:
                break

    def handle_data(self, data):
        if self._open and not self._hidden_depth:
            self._open[-1][2].append(data)


def parse_help_page(path: Path) -> list[tuple[str, str]]:
    """(unit key, text) for every paragraph and heading of a help page, in document order.

    An id may occur more than once in a page (embedded sections), so the key is the id plus its occurrence number.
    """
    parser = _HelpUnitParser()
    parser.feed(path.read_text(encoding="utf-8", errors="replace"))
    parser.close()
    seen: dict[str, int] = {}
    units = []
    for unit, text in parser.units:
        seen[unit] = seen.get(unit, 0) + 1
        units.append((f"{unit}#{seen[unit]}", html.unescape(text)))
    return units


def file_split(relative_path: str) -> str:
    """The split of a help file: CRC-32 of its relative path modulo 100, below 3 test, below 5 validation."""
    bucket = zlib.crc32(relative_path.encode("utf-8")) % 100
    return "test" if bucket < TEST_BELOW else "validation" if bucket < VALIDATION_BELOW else "train"


def align_help_trees(source_root: Path, target_root: Path) -> Iterator[tuple[str, str, str]]:
    """(relative file path, source text, target text) for every unit present in both trees."""
    for source_file in sorted(source_root.rglob("*.html")):
        relative = source_file.relative_to(source_root).as_posix()
        target_file = target_root / relative
        if not target_file.exists():
            continue
        targets = dict(parse_help_page(target_file))
        for key, source_text in parse_help_page(source_file):
            target_text = targets.get(key)
            if target_text:
                yield relative, source_text, target_text


def split_and_deduplicate(rows: Iterable[tuple[str, str, str]]) -> DatasetDict:
    """Group (file, source, target) rows by `file_split`, drop duplicate pairs, and drop from validation and
    test every pair whose source sentence already occurs in an earlier split."""
    pairs: dict[str, dict[tuple[str, str], None]] = {split: {} for split in SPLITS}
    for relative, source, target in rows:
        pairs[file_split(relative)][(source, target)] = None
    seen_sources: set[str] = set()
    columns = {}
    for split in SPLITS:
        kept = [pair for pair in pairs[split] if pair[0] not in seen_sources]
        seen_sources.update(source for source, _ in kept)
        columns[split] = Dataset.from_dict({"source": [s for s, _ in kept], "target": [t for _, t in kept]})
    return DatasetDict(columns)


def libreoffice_help_corpus(
    source_lang: str = "en", target_lang: str = "de", cache_dir: str | Path | None = None
) -> DatasetDict:
    """The LibreOffice help corpus for a language pair, built once and cached on disk.

    English is the only source language the help is written in; `target_lang` is any language Debian packages
    the help in (de, fr, es, it, ja, pt-BR, ...).
    """
    if source_lang.lower() not in ("en", "en-us"):
        raise ValueError(f"source_lang={source_lang!r}: the LibreOffice help is written in English; use 'en'.")
    suffix, folder = debian_language(target_lang)
    cache_dir = Path(cache_dir or DEFAULT_CACHE)
    cached = cache_dir / f"libreoffice-help-en-{suffix}"
    if (cached / "dataset_dict.json").exists():
        return load_from_disk(str(cached))
    cache_dir.mkdir(parents=True, exist_ok=True)
    english = fetch_debian_package("libreoffice-help-en-us", cache_dir)
    other = fetch_debian_package(f"libreoffice-help-{suffix}", cache_dir)
    help_root = Path("usr/share/libreoffice/help")
    source_root, target_root = english / help_root / "en-US", other / help_root / folder
    if not target_root.exists():
        found = sorted(p.name for p in (other / help_root).iterdir()) if (other / help_root).exists() else []
        raise CorpusError(f"libreoffice-help-{suffix} has no help folder {folder!r}; it holds {found}.")
    corpus = split_and_deduplicate(align_help_trees(source_root, target_root))
    _check_not_empty(corpus, f"libreoffice-help-{suffix}")
    _save_atomically(corpus, cached)
    return corpus


# ---------------------------------------------------------------------------------------------------------------------
# LibreOffice user-interface strings
# ---------------------------------------------------------------------------------------------------------------------


def read_mo_catalogue(path: Path) -> Iterator[tuple[str, str]]:
    """(English, translation) pairs of a gettext .mo file; the msgid is `context\\x04English`."""
    with path.open("rb") as handle:
        catalogue = gettext.GNUTranslations(handle)._catalog  # the parsed .mo table
    for msgid, msgstr in catalogue.items():
        if not isinstance(msgid, str) or not msgid or not msgstr:
            continue  # plural forms come as (msgid, n) tuples; the header has an empty msgid
        english = msgid.split("\x04", 1)[-1]
        english, translation = " ".join(english.split()), " ".join(msgstr.split())
        if english and translation:
            yield english, translation


def libreoffice_ui_corpus(target_lang: str = "de", cache_dir: str | Path | None = None) -> DatasetDict:
    """The LibreOffice user-interface strings (`libreoffice-l10n-<lang>`), split by catalogue file like the help."""
    suffix, _ = debian_language(target_lang)
    cache_dir = Path(cache_dir or DEFAULT_CACHE)
    cached = cache_dir / f"libreoffice-ui-en-{suffix}"
    if (cached / "dataset_dict.json").exists():
        return load_from_disk(str(cached))
    cache_dir.mkdir(parents=True, exist_ok=True)
    unpacked = fetch_debian_package(f"libreoffice-l10n-{suffix}", cache_dir)
    root = unpacked / "usr/lib/libreoffice/program/resource"
    catalogues = sorted(root.glob("*/LC_MESSAGES/*.mo"))

    def rows():
        for path in catalogues:
            for english, translation in read_mo_catalogue(path):
                yield path.name, english, translation

    corpus = split_and_deduplicate(rows())
    _check_not_empty(corpus, f"libreoffice-l10n-{suffix}")
    _save_atomically(corpus, cached)
    return corpus


# ---------------------------------------------------------------------------------------------------------------------
# Local files and WMT14
# ---------------------------------------------------------------------------------------------------------------------


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
    sources, targets = [], []
    if target_path is not None:
        target_path = Path(target_path)
        source_lines = read_text(path).splitlines()
        target_lines = read_text(target_path).splitlines()
        if len(source_lines) != len(target_lines):
            raise ValueError(
                f"{path} has {len(source_lines)} lines but {target_path} has {len(target_lines)}; "
                "two aligned text files need the same number of lines."
            )
        sources, targets = source_lines, target_lines
    elif path.suffix in (".jsonl", ".json"):
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
            sources.append(record["source"])
            targets.append(record["target"])
    else:
        for number, line in enumerate(read_text(path).splitlines(), 1):
            if not line.strip():
                continue
            fields = line.split("\t")
            if len(fields) != 2:
                raise ValueError(
                    f"{path}:{number} has {len(fields)} tab-separated fields; a TSV needs exactly 2 "
                    f"(source<TAB>target): {line[:200]!r}"
                )
            sources.append(fields[0])
            targets.append(fields[1])
    keep = [i for i, (s, t) in enumerate(zip(sources, targets, strict=True)) if s.strip() and t.strip()]
    if not keep:
        raise CorpusError(f"{path} holds no sentence pair.")
    return Dataset.from_dict(
        {"source": [sources[i].strip() for i in keep], "target": [targets[i].strip() for i in keep]}
    )


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


# ---------------------------------------------------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------------------------------------------------


def _check_not_empty(corpus: DatasetDict, name: str) -> None:
    empty = [split for split in SPLITS if len(corpus[split]) == 0]
    if empty:
        raise CorpusError(
            f"The corpus built from {name} has no pairs in {empty}. The package may be a stub or empty in this "
            "Debian release; pick another language or use --data_files."
        )


def _save_atomically(corpus: DatasetDict, path: Path) -> None:
    """Write to a temporary folder, then rename, so that an interrupted build never looks complete."""
    tmp = path.with_name(path.name + ".tmp")
    if tmp.exists():
        shutil.rmtree(tmp)
    corpus.save_to_disk(str(tmp))
    if path.exists():
        shutil.rmtree(path)
    tmp.rename(path)


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
