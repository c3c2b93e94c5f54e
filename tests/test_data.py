"""Corpus building: LibreOffice help pages (aligned by id, hidden spans dropped, split by file), UI catalogues,
local parallel files, WMT14 up to the network call, and clear errors."""

from __future__ import annotations

import json
import os
import shutil
import struct
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest
from datasets import Dataset, DatasetDict

from hf_vanilla_transformer.data import corpora, libreoffice
from hf_vanilla_transformer.data.cache import open_arrow, prune
from hf_vanilla_transformer.data.corpora import read_parallel_file, wmt_to_pairs
from hf_vanilla_transformer.data.libreoffice import (
    align_help_trees,
    debian_language,
    file_split,
    message_split,
    parse_help_page,
    read_mo_catalogue,
    split_and_deduplicate,
)
from hf_vanilla_transformer.data.splits import CorpusError


PAGE = """<!DOCTYPE html><html><head><title>{title}</title></head><body>
<div id="DisplayArea">
<h1 id="hd_id1" dir="auto">{heading}</h1>
<p id="par_id2" class="paragraph">{first} <span class="menuitem">{menu}</span>.</p>
<p id="par_id3">{platform}<span hidden="true" id="MAC_1" class="MAC">{mac}</span><br>{second}</p>
<div class="embedded"><p id="par_id2">{embedded}</p></div>
<p id="bm_id9">not a unit</p>
<p id="par_id4">&lt;tag&gt; &amp; {entity}</p>
</div></body></html>"""

ENGLISH = dict(
    title="Help",
    heading="Position and Size",
    first="Choose",
    menu="Format - Image",
    platform="Press Ctrl",
    mac="Press Cmd",
    second="to copy.",
    embedded="Embedded text.",
    entity="more",
)
GERMAN = dict(
    title="Hilfe",
    heading="Position und Größe",
    first="Wählen Sie",
    menu="Format – Bild",
    platform="Drücken Sie Strg",
    mac="Drücken Sie Cmd",
    second="zum Kopieren.",
    embedded="Eingebetteter Text.",
    entity="mehr",
)


def write_tree(root: Path, pages: dict[str, dict]) -> Path:
    for relative, values in pages.items():
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(PAGE.format(**values), encoding="utf-8")
    return root


@pytest.fixture
def help_trees(tmp_path):
    """Two help trees in the Debian layout: en-US and de, the same files, one file missing in German."""
    names = [f"text/swriter/01/{i:04d}.html" for i in range(40)]
    english = {name: {**ENGLISH, "heading": f"Heading {i}"} for i, name in enumerate(names)}
    german = {name: {**GERMAN, "heading": f"Überschrift {i}"} for i, name in enumerate(names[:-1])}
    help_root = tmp_path / "usr/share/libreoffice/help"
    return write_tree(help_root / "en-US", english), write_tree(help_root / "de", german), names


def test_units_are_paragraphs_and_headings_without_hidden_spans(help_trees):
    english_root, _, names = help_trees
    units = parse_help_page(english_root / names[0])
    assert units == [
        ("hd_id1#1", "Heading 0"),
        ("par_id2#1", "Choose Format - Image."),
        ("par_id3#1", "Press Ctrl to copy."),  # the hidden Mac variant is gone, <br> is a space
        ("par_id2#2", "Embedded text."),  # a repeated id is a second unit
        ("par_id4#1", "<tag> & more"),
    ]


def test_trees_align_by_file_and_id(help_trees):
    english_root, german_root, names = help_trees
    rows = list(align_help_trees(english_root, german_root))
    assert len(rows) == 5 * (len(names) - 1)  # the file missing in German contributes nothing
    assert (names[0], "Choose Format - Image.", "Wählen Sie Format – Bild.") in rows
    assert (names[0], "Press Ctrl to copy.", "Drücken Sie Strg zum Kopieren.") in rows
    assert (names[3], "Heading 3", "Überschrift 3") in rows


def test_split_is_by_file_stable_and_held_out(help_trees):
    english_root, german_root, names = help_trees
    # The rule: CRC-32 of the relative path modulo 100 (documented in data/libreoffice.py); test_fixed_split_assignments pins it.
    splits = {name: file_split(name) for name in names}
    assert set(splits.values()) <= {"train", "validation", "test"}
    corpus = split_and_deduplicate(align_help_trees(english_root, german_root))
    # Every heading (unique per file) lands in its file's split.
    for split in ("train", "validation", "test"):
        for source in corpus[split]["source"]:
            if source.startswith("Heading "):
                assert splits[names[int(source.split()[1])]] == split
    # Pairs shared by all files occur once, in the first split, and never again in a held-out one.
    sources = [s for split in ("train", "validation", "test") for s in corpus[split]["source"]]
    assert len(sources) == len(set(sources))
    assert "Choose Format - Image." in list(corpus["train"]["source"])


def test_fixed_split_assignments():
    """Values written down once from the rule (CRC-32 of the path mod 100: 0-2 test, 3-4 validation, else train):
    a change of the rule would silently move pages between training and the held-out splits."""
    assert file_split("text/scalc/01/41.html") == "test"  # bucket 1
    assert file_split("text/scalc/01/146.html") == "test"  # bucket 1
    assert file_split("text/scalc/01/107.html") == "validation"  # bucket 3
    assert [file_split(f"text/scalc/01/{i}.html") for i in range(6)] == ["train"] * 6
    assert file_split("text/swriter/main0000.html") == "train"
    assert file_split("text/shared/01/01010000.html") == "train"


def test_language_codes_map_to_debian_names():
    assert debian_language("de") == ("de", "de")
    assert debian_language("pt-BR") == ("pt-br", "pt-BR")
    assert debian_language("zh_cn") == ("zh-cn", "zh-CN")
    with pytest.raises(ValueError, match="'de fr'"):
        debian_language("de fr")


def write_mo(path: Path, messages: dict[str, str]) -> None:
    """A GNU .mo catalogue (the format msgfmt writes)."""
    keys = sorted(messages)
    ids = b"".join(k.encode() + b"\0" for k in keys)
    strs = b"".join(messages[k].encode() + b"\0" for k in keys)
    n, header = len(keys), 7 * 4
    ids_start = header + 16 * n
    strs_start = ids_start + len(ids)
    offsets, position = [], 0
    for key in keys:
        offsets.append((len(key.encode()), ids_start + position))
        position += len(key.encode()) + 1
    str_offsets, position = [], 0
    for key in keys:
        str_offsets.append((len(messages[key].encode()), strs_start + position))
        position += len(messages[key].encode()) + 1
    table = b"".join(struct.pack("<II", *o) for o in offsets) + b"".join(struct.pack("<II", *o) for o in str_offsets)
    path.write_bytes(struct.pack("<7I", 0x950412DE, 0, n, header, header + 8 * n, 0, 0) + table + ids + strs)


def test_ui_catalogues_give_english_and_translation(tmp_path):
    mo = tmp_path / "sw.mo"
    write_mo(mo, {"": "Content-Type: text/plain; charset=UTF-8\n", "STR_SAVE\x04Save  As": "Speichern unter", "x": ""})
    assert list(read_mo_catalogue(mo)) == [("Save As", "Speichern unter")]


# The catalogues of Debian 12's libreoffice-l10n-de, by name: split by file (main's rule before), one went to test
# (pcr.mo) and none to validation, so `--dataset libreoffice-ui` stopped before training.
DEBIAN_CATALOGUES = (
    *("acc", "avmedia", "basctl", "chart", "cnr", "cui", "dba", "dkt", "editeng", "flt", "for", "fps", "frm", "fwk"),
    *("oox", "pcr", "rpt", "sb", "sc", "sca", "scc", "sd", "sfx", "sm", "svl", "svt", "svx", "sw", "uui", "vcl"),
    *("wiz", "wpt", "xsc"),
)


def write_ui_package(root: Path) -> None:
    """An unpacked package laid out as libreoffice-l10n-de is: 33 catalogues of 40 messages each, and messages that
    recur (in two catalogues with two translations, with and without the `~` of their accelerator key)."""
    folder = root / "usr/lib/libreoffice/program/resource/de/LC_MESSAGES"
    folder.mkdir(parents=True)
    header = {"": "Content-Type: text/plain; charset=UTF-8\n"}
    for name in DEBIAN_CATALOGUES:
        messages = {f"CTX\x04Message {i} of {name}": f"Nachricht {i} aus {name}" for i in range(40)}
        write_mo(folder / f"{name}.mo", {**header, **messages})
    write_mo(folder / "extra.mo", {**header, "A\x04OK": "OK", "B\x04~Open": "~Öffnen", "C\x04Media Player": "Medien"})
    write_mo(folder / "more.mo", {**header, "A\x04OK": "Okay", "B\x04Open": "Öffnen", "C\x04media player": "Player"})


def test_ui_messages_are_split_by_their_english_text_into_three_non_empty_splits(tmp_path, monkeypatch):
    """On a package laid out as Debian's (`write_ui_package`), every split holds pairs, each message lands where the
    hash of its English text puts it, and all copies of a message together."""
    write_ui_package(tmp_path / "unpacked")
    monkeypatch.setattr(libreoffice, "fetch_debian_package", lambda package, cache_dir: tmp_path / "unpacked")
    corpus = libreoffice.libreoffice_ui_corpus("de", cache_dir=tmp_path / "cache")
    sizes = {split: len(corpus[split]) for split in ("train", "validation", "test")}
    assert sizes["train"] > 1000 and sizes["validation"] > 10 and sizes["test"] > 10, sizes
    pairs = {split: set(zip(corpus[split]["source"], corpus[split]["target"], strict=True)) for split in corpus}
    # Values written down once from the rule (CRC-32 of the English text without `~`, case folded, modulo 100).
    assert {("OK", "OK"), ("OK", "Okay")} <= pairs["validation"]
    assert {("~Open", "~Öffnen"), ("Open", "Öffnen")} <= pairs["train"]
    assert {("Media Player", "Medien"), ("media player", "Player")} <= pairs["test"]
    assert [message_split(text) for text in ("100%", "Save As", "Cancel")] == ["test", "train", "train"]
    for split, held in pairs.items():
        assert all(message_split(source) == split for source, _ in held)


def test_more_training_pairs_leave_the_held_out_splits_unseen():
    """The UI strings join the help's training split: a pair whose source the training split holds already is not
    added, nor one whose source is a validation or test sentence but for its case or the `~` or `_` of an
    accelerator key; the held-out splits stay whole."""
    corpus = DatasetDict(
        {
            "train": Dataset.from_dict(
                {"source": ["Open", "Close the file."], "target": ["Öffnen", "Datei schließen."]}
            ),
            "validation": Dataset.from_dict({"source": ["Insert Table"], "target": ["Tabelle einfügen"]}),
            "test": Dataset.from_dict({"source": ["Save As"], "target": ["Speichern unter"]}),
        }
    )
    ui = Dataset.from_dict(
        {
            "source": ["Open", "insert table", "SAVE AS", "Insert ~Table", "Save _As", "Save", "~Print", "Save as PDF"],
            "target": [
                *("~Öffnen", "Tabelle einfügen", "Speichern unter", "~Tabelle einfügen", "Speichern _unter"),
                *("Speichern", "~Drucken", "Als PDF speichern"),
            ],
        }
    )
    joined = libreoffice.with_more_training(corpus, ui)
    assert list(zip(joined["train"]["source"], joined["train"]["target"], strict=True)) == [
        ("Open", "Öffnen"),
        ("Close the file.", "Datei schließen."),
        ("Save", "Speichern"),
        ("~Print", "~Drucken"),
        ("Save as PDF", "Als PDF speichern"),
    ]
    for split in ("validation", "test"):
        assert joined[split].to_dict() == corpus[split].to_dict()


def write_help_and_ui_packages(root: Path, monkeypatch) -> None:
    """The help trees of 200 pages (enough for every split) and the UI catalogues (`write_ui_package`) in one
    unpacked folder, `root`, which serves every package the corpora fetch."""
    names = [f"text/swriter/01/{i:04d}.html" for i in range(200)]
    help_root = root / "usr/share/libreoffice/help"
    write_tree(help_root / "en-US", {name: {**ENGLISH, "heading": f"Heading {i}"} for i, name in enumerate(names)})
    write_tree(help_root / "de", {name: {**GERMAN, "heading": f"Überschrift {i}"} for i, name in enumerate(names)})
    write_ui_package(root)
    monkeypatch.setattr(libreoffice, "fetch_debian_package", lambda package, cache_dir: root)


def test_the_help_with_the_ui_strings_is_the_help_and_the_ui_training_messages(tmp_path, monkeypatch):
    """`--dataset libreoffice-help-ui`: the help corpus's splits, its training split followed by the UI corpus's
    training messages (here none is a help sentence), cached as one entry."""
    write_help_and_ui_packages(tmp_path, monkeypatch)
    cache = tmp_path / "cache"
    joined = corpora.load_corpus("libreoffice-help-ui", cache_dir=cache)
    help_corpus = libreoffice.libreoffice_help_corpus(cache_dir=cache)
    ui = libreoffice.libreoffice_ui_corpus(cache_dir=cache)
    for column in ("source", "target"):
        assert list(joined["train"][column]) == [*help_corpus["train"][column], *ui["train"][column]]
    for split in ("validation", "test"):
        assert joined[split].to_dict() == help_corpus[split].to_dict() and len(joined[split]) > 0
    assert len(list((cache / "libreoffice-help-ui-en-de-joined").iterdir())) == 1


def test_the_joined_corpus_is_built_again_when_what_it_joins_changes(tmp_path, monkeypatch):
    """The joined corpus is cached by the two corpora's cached files and the join's rule: the UI corpus built again
    with one more message, or a new rule, gives a new joined corpus, never the one cached before; an entry replaced
    goes once it has been unused for an hour."""
    write_help_and_ui_packages(tmp_path, monkeypatch)
    cache, added = tmp_path / "cache", ("Save As", "Speichern unter")  # a message of the UI's training split
    joined = cache / "libreoffice-help-ui-en-de-joined"

    def pairs() -> set[tuple[str, str]]:
        train = corpora.load_corpus("libreoffice-help-ui", cache_dir=cache)["train"]
        return set(zip(train["source"], train["target"], strict=True))

    assert added not in pairs()
    catalogues = tmp_path / "usr/lib/libreoffice/program/resource/de/LC_MESSAGES"
    write_mo(
        catalogues / "new.mo", {"": "Content-Type: text/plain; charset=UTF-8\n", "D\x04Save As": "Speichern unter"}
    )
    assert added not in pairs()  # the UI corpus itself is cached: nothing changed yet
    shutil.rmtree(cache / "libreoffice-ui-messages-en-de")  # as a damaged entry is: built again, now with the message
    assert added in pairs()
    assert len(list(joined.iterdir())) == 2  # the first was used a moment ago: it stays for now

    def age_all() -> None:  # every entry unused for two hours or more, the newest for longest
        for hours, entry in enumerate(sorted(joined.iterdir(), key=lambda entry: entry.stat().st_mtime), start=2):
            os.utime(entry, (time.time() - 3600 * hours,) * 2)

    current = max(joined.iterdir(), key=lambda entry: entry.stat().st_mtime)  # the entry with the message
    age_all()
    assert added in pairs()  # read again: the entry read is used now and stays, the one it replaced goes
    assert list(joined.iterdir()) == [current]
    monkeypatch.setattr(libreoffice, "JOIN_RULE", libreoffice.JOIN_RULE + 1)
    monkeypatch.setattr(libreoffice, "with_more_training", lambda corpus, more: corpus)  # a rule that adds nothing
    age_all()
    assert added not in pairs()
    assert [entry.name for entry in joined.iterdir()] != [current.name] and len(list(joined.iterdir())) == 1


def test_prune_keeps_the_newest_and_skips_an_entry_another_job_removed(tmp_path):
    """Entries by their time of use: the `keep` newest stay and so does any used within `idle_seconds`; an entry
    that is gone by the time it is looked at (another job pruned it: here a link to nothing) is passed over."""
    ages = {"newest": 60, "recent": 120, "idle": 7200, "idler": 10800}  # seconds since each was used
    for name, seconds in ages.items():
        (tmp_path / name).mkdir()
        os.utime(tmp_path / name, (time.time() - seconds,) * 2)
    (tmp_path / "gone").symlink_to(tmp_path / "nowhere")
    removed = prune(tmp_path, keep=1, idle_seconds=3600)
    assert sorted(path.name for path in removed) == ["idle", "idler"]
    assert sorted(path.name for path in tmp_path.iterdir()) == ["gone", "newest", "recent"]


def test_tsv_jsonl_and_aligned_text_files(tmp_path):
    (tmp_path / "a.tsv").write_text("Hello\tHallo\n\nWorld\tWelt\n", encoding="utf-8")
    assert list(read_parallel_file(tmp_path / "a.tsv")["target"]) == ["Hallo", "Welt"]
    (tmp_path / "a.jsonl").write_text(
        json.dumps({"source": "One", "target": "Eins"})
        + "\n"
        + json.dumps({"translation": {"en": "Two", "de": "Zwei"}})
        + "\n"
    )
    assert read_parallel_file(tmp_path / "a.jsonl")["source"] == ["One", "Two"]
    (tmp_path / "s.txt").write_text("a\nb\n")
    (tmp_path / "t.txt").write_text("A\nB\n")
    assert read_parallel_file(tmp_path / "s.txt", tmp_path / "t.txt")["target"] == ["A", "B"]
    aligned = f"{tmp_path / 's.txt'},{tmp_path / 't.txt'}"
    corpus = corpora.parallel_files_corpus(aligned, validation=str(tmp_path / "a.tsv"))
    assert set(corpus) == {"train", "validation"} and corpus["train"]["source"] == ["a", "b"]
    # For training, the test pairs not given are carved out of the training file as it is cached (`hold_out_files`).
    corpus = corpora.parallel_files_corpus(aligned, validation=str(tmp_path / "a.tsv"), carve=True)
    assert set(corpus) == {"train", "validation", "test"}
    assert sorted([*corpus["train"]["source"], *corpus["test"]["source"]]) == ["a", "b"]


def test_bad_parallel_files_are_named(tmp_path):
    with pytest.raises(FileNotFoundError, match="missing.tsv"):
        read_parallel_file(tmp_path / "missing.tsv")
    (tmp_path / "bad.tsv").write_text("one field only\n")
    with pytest.raises(ValueError, match=r"bad.tsv:1 has 1 tab-separated fields"):
        read_parallel_file(tmp_path / "bad.tsv")
    (tmp_path / "s.txt").write_text("a\nb\n")
    (tmp_path / "t.txt").write_text("A\n")
    with pytest.raises(ValueError, match="has 2 lines but .* has 1"):
        read_parallel_file(tmp_path / "s.txt", tmp_path / "t.txt")
    (tmp_path / "empty.tsv").write_text("\n")
    with pytest.raises(CorpusError, match="no sentence pair"):
        read_parallel_file(tmp_path / "empty.tsv")
    (tmp_path / "bad.jsonl").write_text('{"src": "x"}\n')
    with pytest.raises(ValueError, match="bad.jsonl:1 has no string 'source'"):
        read_parallel_file(tmp_path / "bad.jsonl")


def test_wmt_rows_become_source_and_target():
    raw = Dataset.from_dict({"translation": [{"de": "Hallo", "en": "Hello"}, {"de": "Welt", "en": "World"}]})
    pairs = wmt_to_pairs(raw, "en", "de")
    assert pairs["source"] == ["Hello", "World"] and pairs["target"] == ["Hallo", "Welt"]


def test_wmt14_without_the_hub_says_what_to_use(monkeypatch):
    import datasets

    def unreachable(*args, **kwargs):
        raise ConnectionError("no route to huggingface.co")

    monkeypatch.setattr(datasets, "load_dataset", unreachable)
    with pytest.raises(CorpusError, match="needs network access to the Hub"):
        corpora.wmt14_corpus("en", "de")


def test_no_apt_says_which_source_to_use_instead(monkeypatch, tmp_path):
    monkeypatch.setattr(libreoffice.shutil, "which", lambda name: None)
    with pytest.raises(CorpusError, match="apt-get and dpkg-deb are not available.*--data_files"):
        libreoffice.libreoffice_help_corpus("en", "de", cache_dir=tmp_path)


def test_unknown_package_is_named(tmp_path):
    if libreoffice.shutil.which("apt-get") is None:
        pytest.skip("needs apt-get")
    with pytest.raises(CorpusError, match="libreoffice-help-xx-nonexistent"):
        libreoffice.fetch_debian_package("libreoffice-help-xx-nonexistent", tmp_path)


def test_unknown_dataset_is_named():
    with pytest.raises(ValueError, match="dataset='europarl'"):
        corpora.load_corpus("europarl")


def test_an_empty_corpus_says_so(help_trees, tmp_path):
    english_root, _, _ = help_trees
    empty = tmp_path / "empty"
    empty.mkdir()
    corpus = split_and_deduplicate(align_help_trees(english_root, empty))
    with pytest.raises(CorpusError, match="no pairs"):
        libreoffice._check_not_empty(corpus, "libreoffice-help-xx")


@pytest.mark.slow
def test_real_debian_fetch_builds_the_en_de_corpus(tmp_path):
    if libreoffice.shutil.which("apt-get") is None:
        pytest.skip("needs apt-get")
    corpus = libreoffice.libreoffice_help_corpus("en", "de", cache_dir=tmp_path)
    assert len(corpus["train"]) > 30000 and len(corpus["validation"]) > 300 and len(corpus["test"]) > 500
    assert not set(corpus["test"]["source"]) & set(corpus["train"]["source"])
    again = libreoffice.libreoffice_help_corpus("en", "de", cache_dir=tmp_path)  # from the on-disk cache
    assert list(again["test"]["source"]) == list(corpus["test"]["source"])
    # The CPU recipe's corpus: the help and the UI strings' training messages, nothing held out of the help seen.
    joined = corpora.load_corpus("libreoffice-help-ui", cache_dir=tmp_path)
    added = len(joined["train"]) - len(corpus["train"])
    assert 10000 < added < len(libreoffice.libreoffice_ui_corpus("de", cache_dir=tmp_path)["train"])
    held_out = {libreoffice.label_key(source) for split in ("validation", "test") for source in corpus[split]["source"]}
    ui_part = joined["train"].select(range(len(corpus["train"]), len(joined["train"])))
    assert not held_out & {libreoffice.label_key(source) for source in ui_part["source"]}
    assert list(joined["test"]["source"]) == list(corpus["test"]["source"])


def help_languages() -> list[str]:
    """The languages Debian packages the LibreOffice help in (`libreoffice-help-<lang>`), as apt knows them."""
    found = subprocess.run(
        ["apt-cache", "search", "--names-only", "^libreoffice-help-"], capture_output=True, text=True
    )
    names = [line.split()[0].removeprefix("libreoffice-help-") for line in found.stdout.splitlines() if line.strip()]
    return sorted(set(names) - {"common", "en-us"})


@pytest.mark.slow
def test_real_debian_ui_corpus_has_every_split_for_every_help_language(tmp_path):
    """Every language the help corpus supports gives a UI corpus with pairs in all three splits (Debian 12: 33
    languages, 6,031 to 22,043 training pairs, 107 to 397 validation pairs), and `--dataset libreoffice-ui` passes its
    data preparation for each."""
    if libreoffice.shutil.which("apt-get") is None:
        pytest.skip("needs apt-get")
    languages = help_languages()
    assert "de" in languages and len(languages) > 20, languages
    for language in languages:
        corpus = libreoffice.libreoffice_ui_corpus(language, cache_dir=tmp_path)
        sizes = {split: len(corpus[split]) for split in ("train", "validation", "test")}
        assert sizes["train"] > 1000 and sizes["validation"] > 20 and sizes["test"] > 20, (language, sizes)
        assert not set(corpus["test"]["source"]) & set(corpus["train"]["source"]), language


# ---------------------------------------------------------------------------------------------------------------------
# WMT14 offline, the corpus cache, held-out splits
# ---------------------------------------------------------------------------------------------------------------------


def wmt14_tree(folder, pair: str = "de-en") -> None:
    """A tiny copy of the Hub's wmt/wmt14 in its layout and schema: <pair>/<split>-0000x-of-0000n.parquet with one
    column `translation: struct<de: string, en: string>` (training split in two shards)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    schema = pa.struct([("de", pa.string()), ("en", pa.string())])
    rows = {
        "train-00000-of-00002": [("Hallo", "Hello"), ("Welt", "World")],
        "train-00001-of-00002": [("Datei", "File")],
        "validation-00000-of-00001": [("Öffnen", "Open")],
        "test-00000-of-00001": [("Speichern Sie.", "Save it."), ("Schließen", "Close")],
    }
    (folder / pair).mkdir(parents=True)
    for name, pairs in rows.items():
        column = pa.array([{"de": de, "en": en} for de, en in pairs], type=schema)
        pq.write_table(pa.table({"translation": column}), folder / pair / f"{name}.parquet")


def test_wmt14_reads_a_local_copy_of_the_hubs_parquet_files_offline_in_both_directions(tmp_path, monkeypatch):
    import datasets

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    wmt14_tree(tmp_path / "wmt14")
    en_de = corpora.wmt14_corpus("en", "de", tmp_path / "wmt14", cache_dir=tmp_path / "cache")
    assert {split: len(en_de[split]) for split in en_de} == {"train": 3, "validation": 1, "test": 2}
    assert en_de["train"]["source"] == ["Hello", "World", "File"] and en_de["test"]["target"][0] == "Speichern Sie."
    de_en = corpora.load_corpus("wmt14", "de", "en", cache_dir=tmp_path / "cache", wmt14_dir=tmp_path / "wmt14")
    assert de_en["validation"][0] == {"source": "Öffnen", "target": "Open"}
    # The same files read the other way round are another corpus to the caches of the BPE and the tokenized split.
    from hf_vanilla_transformer.data.cache import dataset_key

    assert dataset_key(en_de["train"]) != dataset_key(de_en["train"]) and dataset_key(en_de["train"]) is not None
    # The columns of the memory-mapped Arrow files the first load wrote: a second load reads them, converting nothing.
    files = {entry["filename"] for entry in en_de["train"].cache_files}
    assert files and all(name.startswith(str(tmp_path / "cache")) for name in files)
    loads = []
    original = datasets.load_dataset
    monkeypatch.setattr(datasets, "load_dataset", lambda *a, **k: loads.append(a) or original(*a, **k))
    again = corpora.wmt14_corpus("en", "de", tmp_path / "wmt14", cache_dir=tmp_path / "cache")
    assert {entry["filename"] for entry in again["train"].cache_files} == files and len(loads) == 1
    with pytest.raises(ValueError, match=r"wmt14_dir=.* holds no train, validation, test parquet files for fr-en"):
        corpora.wmt14_corpus("en", "fr", tmp_path / "wmt14", cache_dir=tmp_path / "cache")


def test_local_files_are_read_into_arrow_once_under_a_key_of_their_content(tmp_path):
    (tmp_path / "a.tsv").write_text("Hello\tHallo\nWorld\tWelt\n", encoding="utf-8")
    first = corpora.parallel_files_corpus(str(tmp_path / "a.tsv"), cache_dir=tmp_path / "cache")
    (path,) = {entry["filename"] for entry in first["train"].cache_files}
    assert first["train"]["target"] == ["Hallo", "Welt"] and path.startswith(str(tmp_path / "cache" / "corpora"))
    # The same bytes elsewhere: the same cache entry; one changed byte: another.
    (tmp_path / "b.tsv").write_bytes((tmp_path / "a.tsv").read_bytes())
    copy = corpora.parallel_files_corpus(str(tmp_path / "b.tsv"), cache_dir=tmp_path / "cache")
    assert copy["train"].cache_files[0]["filename"] != path  # the file's name is part of what was asked
    (tmp_path / "a.tsv").write_text("Hello\tHallo\nWorld\tWelt!\n", encoding="utf-8")
    changed = corpora.parallel_files_corpus(str(tmp_path / "a.tsv"), cache_dir=tmp_path / "cache")
    assert changed["train"]["target"] == ["Hallo", "Welt!"] and changed["train"].cache_files[0]["filename"] != path
    # A bad line still names the file and the line, before anything is cached.
    (tmp_path / "bad.tsv").write_text("fine\tgut\nbroken\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"bad.tsv:2 has 1 tab-separated fields"):
        corpora.parallel_files_corpus(str(tmp_path / "bad.tsv"), cache_dir=tmp_path / "cache")
    (tmp_path / "latin1.tsv").write_bytes("Gr\xfc\xdfe\tx\n".encode("latin-1"))
    with pytest.raises(ValueError, match=r"latin1.tsv:1 is not UTF-8 text \(byte 0xfc"):
        corpora.parallel_files_corpus(str(tmp_path / "latin1.tsv"), cache_dir=tmp_path / "cache")
    assert not list((tmp_path / "cache" / "corpora").glob("*.tmp-*"))  # nothing half-written looks complete
    assert len(list((tmp_path / "cache" / "corpora").iterdir())) == 3


def test_a_lone_training_file_is_carved_in_the_cache_as_in_memory(tmp_path):
    """A lone training file gets its held-out pairs as it is read into the cache: the same pairs `hold_out` carves
    in memory, the training split written again without them (no index of its rows held in memory)."""
    lines = [f"s{i}\tt{i}" for i in range(3000)]
    (tmp_path / "train.tsv").write_text("\n".join(lines) + "\n", encoding="utf-8")
    cached = corpora.parallel_files_corpus(str(tmp_path / "train.tsv"), cache_dir=tmp_path / "cache", carve=True)
    whole = corpora.parallel_files_corpus(str(tmp_path / "train.tsv"), cache_dir=tmp_path / "cache")
    assert list(whole) == ["train"] and len(whole["train"]) == 3000  # (scoring a file: every pair)
    in_memory = corpora.hold_out(DatasetDict({"train": read_parallel_file(tmp_path / "train.tsv")}))
    for split in ("train", "validation", "test"):
        assert cached[split]["source"] == in_memory[split]["source"], split
        assert cached[split]._indices is None and cached[split].cache_files
    assert [len(cached[split]) for split in ("train", "validation", "test")] == [2700, 150, 150]
    assert corpora.hold_out(cached) is cached
    # Read again: the cache, not the file.
    again = corpora.parallel_files_corpus(str(tmp_path / "train.tsv"), cache_dir=tmp_path / "cache", carve=True)
    assert again["train"].cache_files == cached["train"].cache_files


def test_held_out_pairs_are_carved_from_a_lone_training_file_with_a_fixed_seed():
    train = Dataset.from_dict({"source": [f"s{i}" for i in range(100)], "target": [f"t{i}" for i in range(100)]})
    corpus = corpora.hold_out(DatasetDict({"train": train}), pairs=1000, fraction=0.05)
    sizes = {split: len(corpus[split]) for split in ("train", "validation", "test")}
    assert sizes == {"train": 90, "validation": 5, "test": 5}  # 5% each: 1,000 is more than a small file allows
    held = set(corpus["validation"]["source"]) | set(corpus["test"]["source"])
    assert len(held) == 10 and not held & set(corpus["train"]["source"])
    # Fixed pairs whatever the run: numpy's generator seeded 0 draws these.
    assert list(corpus["validation"]["source"]) == ["s25", "s47", "s58", "s77", "s81"]
    assert list(corpus["test"]["source"]) == ["s1", "s3", "s7", "s17", "s29"]
    # A corpus with its own held-out splits is left alone; a given validation file keeps only the test to carve.
    given = DatasetDict({"train": train, "validation": train.select(range(3)), "test": train.select(range(2))})
    assert corpora.hold_out(given) is given
    partial = corpora.hold_out(DatasetDict({"train": train, "validation": train.select(range(3))}))
    assert len(partial["validation"]) == 3 and len(partial["test"]) == 5 and len(partial["train"]) == 95
    with pytest.raises(CorpusError, match="3 pairs: too few to hold out validation and test"):
        corpora.hold_out(DatasetDict({"train": train.select(range(3))}))


def test_released_pages_of_a_mapped_arrow_file_read_the_same_and_writable_maps_are_left_alone(tmp_path):
    """`release_mapped_pages` unmaps the pages a process read of its read-only Arrow maps (its resident memory
    drops; the rows read the same afterwards) and never touches a writable map (whose pages could hold data)."""
    from hf_vanilla_transformer.utils.machine import mapped_bytes, release_mapped_pages

    pairs = ((f"source sentence {i} " * 8, f"target sentence {i} " * 8) for i in range(40000))
    corpora.write_pairs(pairs, tmp_path / "train.arrow")
    data = open_arrow(tmp_path / "train.arrow")
    before = data[:]
    assert mapped_bytes()["arrow_rss_bytes"] > 8 * 2**20  # read: mapped
    assert release_mapped_pages() > 0
    assert mapped_bytes()["arrow_rss_bytes"] < 2**20 and data[:] == before
    (tmp_path / "scratch.arrow").write_bytes(bytes(2**20))
    writable = np.memmap(tmp_path / "scratch.arrow", dtype=np.uint8, mode="c")  # copy-on-write: its own pages
    writable[:] = 7
    release_mapped_pages()
    assert int(writable.sum()) == 7 * 2**20


def test_a_split_opened_again_in_a_worker_reads_its_headers_lightly_and_the_same_rows(tmp_path):
    """A Dataset unpickled in a tokenizing worker or the BPE's child is opened again by `datasets`; inside
    `headers_read_lightly` that goes through `read_arrow_table` (its headers' pages unmapped as they are read), the
    rows the same, and `datasets` is left as it was after the block."""
    import pickle

    import datasets.table

    from hf_vanilla_transformer.data.cache import headers_read_lightly, read_arrow_table

    corpora.write_pairs(((f"s{i}", f"t{i}") for i in range(120_000)), tmp_path / "train.arrow")
    split = open_arrow(tmp_path / "train.arrow").select(range(1000, 3000))
    opened = []
    original = datasets.table._memory_mapped_arrow_table_from_file
    with headers_read_lightly():
        assert datasets.table._memory_mapped_arrow_table_from_file is not original
        reopened = pickle.loads(pickle.dumps(split))
        opened.append(datasets.table._memory_mapped_arrow_table_from_file(str(tmp_path / "train.arrow")))
    assert datasets.table._memory_mapped_arrow_table_from_file is original
    assert reopened["source"] == split["source"] and reopened[0]["target"] == "t1000"
    assert opened[0].equals(read_arrow_table(tmp_path / "train.arrow"))
    assert [batch.num_rows for batch in opened[0].to_batches()] == [50_000, 50_000, 20_000]
