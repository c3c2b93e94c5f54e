"""The LibreOffice corpora, from Debian's packages: real human translations that install offline.

* **LibreOffice help** (the default, EN-DE): `libreoffice-help-en-us` and `libreoffice-help-<lang>` ship the same
  help pages in many languages, paragraph by paragraph, with the same file paths and element ids, so pairs align
  exactly.
* **LibreOffice UI strings** (`libreoffice-l10n-<lang>`): the gettext catalogues of the user interface, short strings
  of a second domain, handy for fine-tuning.
* **Both** (`libreoffice-help-ui`, the CPU recipe's): the help corpus with the UI strings' training messages added to
  its training split; the help's validation and test splits, so its figures compare with the help's.

The packages are fetched with `apt-get download` and unpacked with `dpkg-deb -x`; LibreOffice itself is never
installed, no Debian version is pinned, and the system is never changed (where apt does not know a package, the
message asks you to run `apt-get update`). A package and its unpacked files have size caps, and only files inside the
unpacked folder are read (a symbolic link out of it is skipped).

The splits follow one fixed rule, the CRC-32 of a key modulo 100: *test* below 3, *validation* below 5, *train*
otherwise. The help is split by file, never by pair (the same paragraph recurs on many pages): the key is the help
file's path relative to its language folder. The UI strings are split by message: the key is the English text
(without its `~` accelerator mark, case folded), so every copy of a message (in several catalogues, or under several
contexts) lands in one split. By catalogue file they could not be: a language has 33 catalogues, too few for shares
of 2 and 3 in 100 (Debian 12's went 32 to training, 1 to test, none to validation). Pairs are de-duplicated, and a
validation or test pair whose source sentence also occurs in an earlier split is dropped, so that nothing held out
was seen in training.
"""

from __future__ import annotations

import gettext
import html
import logging
import re
import shutil
import subprocess
import tempfile
import zlib
from collections.abc import Callable, Iterable, Iterator
from html.parser import HTMLParser
from pathlib import Path

from datasets import Dataset, DatasetDict, load_from_disk

from .cache import building, cache_root, complete_folder, dataset_key, entry_lock, prune, text_key, touch
from .splits import SPLITS, CorpusError


logger = logging.getLogger(__name__)

TEST_BELOW, VALIDATION_BELOW = 3, 5  # CRC-32(path) % 100 thresholds of the file-level split
# Caps: a help package is 2-4 MB packed and under 30 MB unpacked (Debian 12); far larger is no corpus package.
MAX_DEB_BYTES = 200_000_000
MAX_UNPACKED_BYTES = 1_000_000_000
UNIT_ID = re.compile(r"^(par|hd)_id")
UNPACKED = ".unpacked"  # written last into a package's folder: the name of the .deb it was unpacked from
# The rule by which the UI strings join the help's training split (`with_more_training`, `label_key`): one more
# whenever it changes, so that a joined corpus cached by an earlier rule is built again rather than read.
JOIN_RULE = 2


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

    Returns the folder the package was unpacked into. A package apt does not know, one larger than `MAX_DEB_BYTES`
    or unpacking to more than `MAX_UNPACKED_BYTES` raises a CorpusError saying so (and what to do) in one line.
    """
    unpacked = cache_dir / "debs" / package
    if (unpacked / UNPACKED).exists():
        return unpacked
    with entry_lock(unpacked, cache_dir):  # one job fetches it; another waits, then finds it
        if not (unpacked / UNPACKED).exists():
            _fetch_and_unpack(package, unpacked, cache_dir)
    return unpacked


def _fetch_and_unpack(package: str, unpacked: Path, cache_dir: Path) -> None:
    if shutil.which("apt-get") is None or shutil.which("dpkg-deb") is None:
        raise CorpusError(
            f"Cannot fetch the Debian package {package}: apt-get and dpkg-deb are not available on this machine. "
            "The LibreOffice corpora come from Debian packages; elsewhere use your own parallel files "
            "(--data_files train.tsv) or WMT14 (--dataset wmt14)."
        )
    with tempfile.TemporaryDirectory(dir=cache_dir) as tmp:
        deb = _download(package, Path(tmp))
        target = Path(tmp) / "unpacked"
        _unpack(deb, target)
        (target / UNPACKED).write_text(deb.name + "\n")  # the folder appears with its mark, whole
        if unpacked.exists():  # an interrupted unpacking of an earlier version
            shutil.rmtree(unpacked)
        unpacked.parent.mkdir(parents=True, exist_ok=True)
        target.rename(unpacked)


def _download(package: str, folder: Path) -> Path:
    """`apt-get download package` into `folder`: the .deb, at most `MAX_DEB_BYTES`. apt's package index is never
    updated here (that changes the system): where apt does not know the package, the error asks the user to."""
    result = subprocess.run(["apt-get", "download", package], cwd=folder, capture_output=True, text=True)
    if result.returncode != 0 and "Unable to locate package" in result.stderr:
        raise CorpusError(
            f"apt-get does not know the package {package}: its package index is missing or out of date. Run "
            "`sudo apt-get update` (this program never changes the system), then try again."
        )
    if result.returncode != 0:
        raise CorpusError(
            f"`apt-get download {package}` failed: {result.stderr.strip()[-500:]}\n"
            f"Check the name with `apt-cache search {package.rsplit('-', 1)[0]}`; a language without a "
            "LibreOffice package cannot be used, pick another one or use --data_files."
        )
    debs = sorted(folder.glob("*.deb"))
    if not debs:
        raise CorpusError(f"`apt-get download {package}` left no .deb file in {folder}.")
    size = debs[0].stat().st_size
    if size > MAX_DEB_BYTES:
        raise CorpusError(
            f"{debs[0].name} is {size:,} bytes, more than a corpus package may be ({MAX_DEB_BYTES:,}): not unpacked."
        )
    return debs[0]


def _unpack(deb: Path, target: Path) -> None:
    """`dpkg-deb -x deb target`, refused where the package says it unpacks to more than `MAX_UNPACKED_BYTES`
    (Installed-Size), and removed where it did (the files' own sizes, links not followed)."""
    declared = subprocess.run(["dpkg-deb", "-f", str(deb), "Installed-Size"], capture_output=True, text=True)
    kib = declared.stdout.strip()
    if declared.returncode == 0 and kib.isdigit() and int(kib) * 1024 > MAX_UNPACKED_BYTES:
        raise CorpusError(
            f"{deb.name} unpacks to {int(kib) * 1024:,} bytes, more than a corpus package may "
            f"({MAX_UNPACKED_BYTES:,}): not unpacked."
        )
    subprocess.run(["dpkg-deb", "-x", str(deb), str(target)], check=True, capture_output=True)
    size = sum(path.lstat().st_size for path in target.rglob("*") if not path.is_symlink() and path.is_file())
    if size > MAX_UNPACKED_BYTES:
        shutil.rmtree(target, ignore_errors=True)
        raise CorpusError(
            f"{deb.name} unpacked to {size:,} bytes, more than a corpus package may ({MAX_UNPACKED_BYTES:,}): removed."
        )


def inside(path: Path, root: Path) -> bool:
    """Whether `path`, its links followed, lies inside `root` (an unpacked package): what points out of it is never
    read (a package's link to /etc/passwd, to another user's files)."""
    return path.resolve().is_relative_to(root.resolve())


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


def message_split(english: str) -> str:
    """The split of a UI message: `file_split`'s rule on its English text without the `~` that marks its accelerator
    key, case folded (`~Open`, `Open` and `open` are one message)."""
    return file_split(" ".join(english.replace("~", "").casefold().split()))


def align_help_trees(source_root: Path, target_root: Path) -> Iterator[tuple[str, str, str]]:
    """(relative file path, source text, target text) for every unit present in both trees; a page that is a link
    out of its tree is skipped (`inside`)."""
    for source_file in sorted(source_root.rglob("*.html")):
        relative = source_file.relative_to(source_root).as_posix()
        target_file = target_root / relative
        if not target_file.exists():
            continue
        if not inside(source_file, source_root) or not inside(target_file, target_root):
            logger.warning("%s links out of its package's folder: skipped", relative)
            continue
        targets = dict(parse_help_page(target_file))
        for key, source_text in parse_help_page(source_file):
            target_text = targets.get(key)
            if target_text:
                yield relative, source_text, target_text


def split_and_deduplicate(
    rows: Iterable[tuple[str, str, str]], split_of: Callable[[str], str] = file_split
) -> DatasetDict:
    """Group (key, source, target) rows by `split_of(key)` (a help file's path by default), drop duplicate pairs,
    and drop from validation and test every pair whose source sentence already occurs in an earlier split."""
    pairs: dict[str, dict[tuple[str, str], None]] = {split: {} for split in SPLITS}
    for key, source, target in rows:
        pairs[split_of(key)][(source, target)] = None
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
    cache_dir = cache_root(cache_dir)

    def build() -> DatasetDict:
        english = fetch_debian_package("libreoffice-help-en-us", cache_dir)
        other = fetch_debian_package(f"libreoffice-help-{suffix}", cache_dir)
        help_root = Path("usr/share/libreoffice/help")
        source_root, target_root = english / help_root / "en-US", other / help_root / folder
        if not target_root.exists():
            found = sorted(p.name for p in (other / help_root).iterdir()) if (other / help_root).exists() else []
            raise CorpusError(f"libreoffice-help-{suffix} has no help folder {folder!r}; it holds {found}.")
        corpus = split_and_deduplicate(align_help_trees(source_root, target_root))
        _check_not_empty(corpus, f"libreoffice-help-{suffix}")
        return corpus

    return _cached_corpus(cache_dir / f"libreoffice-help-en-{suffix}", cache_dir, build)


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


def ui_catalogues(unpacked: Path) -> list[Path]:
    """The gettext catalogues of an unpacked `libreoffice-l10n-<lang>` package (links out of it skipped)."""
    root = unpacked / "usr/lib/libreoffice/program/resource"
    return sorted(path for path in root.glob("*/LC_MESSAGES/*.mo") if inside(path, root))


def split_ui_messages(catalogues: Iterable[Path]) -> DatasetDict:
    """The (English, translation) pairs of the catalogues, split by message (`message_split`) and de-duplicated."""
    rows = ((english, english, translation) for path in catalogues for english, translation in read_mo_catalogue(path))
    return split_and_deduplicate(rows, split_of=message_split)


def libreoffice_ui_corpus(target_lang: str = "de", cache_dir: str | Path | None = None) -> DatasetDict:
    """The LibreOffice user-interface strings (`libreoffice-l10n-<lang>`), split by message (`message_split`)."""
    suffix, _ = debian_language(target_lang)
    cache_dir = cache_root(cache_dir)

    def build() -> DatasetDict:
        unpacked = fetch_debian_package(f"libreoffice-l10n-{suffix}", cache_dir)
        corpus = split_ui_messages(ui_catalogues(unpacked))
        _check_not_empty(corpus, f"libreoffice-l10n-{suffix}")
        return corpus

    # Named apart from the folder of the split by catalogue file that earlier versions cached.
    return _cached_corpus(cache_dir / f"libreoffice-ui-messages-en-{suffix}", cache_dir, build)


# ---------------------------------------------------------------------------------------------------------------------
# The help with the UI strings' training messages
# ---------------------------------------------------------------------------------------------------------------------


def libreoffice_help_ui_corpus(
    source_lang: str = "en", target_lang: str = "de", cache_dir: str | Path | None = None
) -> DatasetDict:
    """The help corpus with the UI strings' training messages added to its training split (`with_more_training`):
    the help's validation and test splits, as `libreoffice_help_corpus` makes them (and checks the languages)."""
    cache_dir = cache_root(cache_dir)
    help_corpus = libreoffice_help_corpus(source_lang, target_lang, cache_dir)
    suffix, _ = debian_language(target_lang)
    ui_train = libreoffice_ui_corpus(target_lang, cache_dir)["train"]
    # Cached by what it is made of: the two corpora's cached files and the join's rule. A corpus built again (a
    # damaged entry) or a new rule gives a new entry; the one it replaces goes once unused for an hour.
    inputs = [dataset_key(help_corpus[split]) for split in SPLITS] + [dataset_key(ui_train)]
    folder = cache_dir / f"libreoffice-help-ui-en-{suffix}-joined"
    entry = folder / text_key(JOIN_RULE, inputs)
    joined = _cached_corpus(entry, cache_dir, lambda: with_more_training(help_corpus, ui_train))
    prune(folder, keep=1)
    return joined


def label_key(text: str) -> str:
    """A sentence as a label compares: without the `~` or `_` that marks an accelerator key (`~Open`, `_Type`), case
    folded, its spaces collapsed. `message_split` keys on the same but for `_` (its splits predate this rule: kept)."""
    return " ".join(text.replace("~", "").replace("_", "").casefold().split())


def with_more_training(corpus: DatasetDict, more: Dataset) -> DatasetDict:
    """`corpus` with the pairs of `more` after its training pairs, but for a pair whose source text the training
    split holds already, or whose `label_key` is that of a validation or test sentence (the UI label `_Type` of a
    held-out help heading `Type` stays unseen); the validation and test splits as they are."""
    held_out = {label_key(source) for split in SPLITS[1:] for source in corpus[split]["source"]}
    seen = set(corpus["train"]["source"])
    added = [
        (source, target)
        for source, target in zip(more["source"], more["target"], strict=True)
        if source not in seen and label_key(source) not in held_out
    ]
    train = Dataset.from_dict(
        {
            "source": [*corpus["train"]["source"], *(source for source, _ in added)],
            "target": [*corpus["train"]["target"], *(target for _, target in added)],
        }
    )
    return DatasetDict({"train": train, **{split: corpus[split] for split in SPLITS[1:]}})


def _check_not_empty(corpus: DatasetDict, name: str) -> None:
    empty = [split for split in SPLITS if len(corpus[split]) == 0]
    if empty:
        raise CorpusError(
            f"The corpus built from {name} has no pairs in {empty}. The package may be a stub or empty in this "
            "Debian release; pick another language or use --data_files."
        )


def _cached_corpus(cached: Path, cache_dir: Path, build: Callable[[], DatasetDict]) -> DatasetDict:
    """The corpus cached at `cached`; where it is missing or damaged, made by `build()` under the entry's lock (a
    second job waits for it, then reads it) and published whole, with its manifest (data/cache.py); marked as used
    (for `prune`) before the lock is let go. Read memory-mapped whatever `datasets`' in-memory threshold says: its
    splits' keys (`dataset_key`) are those of its files."""
    with entry_lock(cached, cache_dir):
        if complete_folder(cached) is None:
            corpus = build()
            with building(cached) as temporary:
                corpus.save_to_disk(str(temporary))
        touch(cached)
    return load_from_disk(str(cached), keep_in_memory=False)
