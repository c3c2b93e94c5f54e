"""A fairseq model's dictionaries and BPE codes as files a transformers tokenizer loads: `FSMTTokenizer`'s
vocab-src.json, vocab-tgt.json and merges.txt, as transformers wrote them for fairseq's WMT19 systems, read by
`VanillaTransformerFairseqTokenizer` (FSMT's tokenizer without its punctuation normalisation, which fairseq's Moses
tokenizer does not do: model/tokenization_vanilla_transformer.py).

fairseq tokenizes with Moses, splits words with subword-nmt's BPE (`lo@@ w`: `@@` marks a piece that a word goes on
after) and looks the pieces up in its dictionary, whose first four symbols are `<s>`, `<pad>`, `</s>`, `<unk>`.
`FSMTTokenizer` does the same with the end of a word marked instead (`lo w</w>`), so each dictionary symbol is
renamed (`lo@@` -> `lo`, `w` -> `w</w>`) and keeps its id; the merges are the codes without their counts.

The checkpoint says which text pipeline it was trained with (`--tokenizer`, `--bpe`: `text_pipeline`): `moses` with
its languages and flags (`--moses-no-dash-splits`, `--moses-no-escape`) and `subword_nmt` or `fastbpe` codes are
honoured; any other tokenizer or BPE is refused by name. A checkpoint that names neither was trained on text prepared
beforehand, as fairseq's published systems were: Moses and the codes beside it are assumed, and the card says so.
"""

from __future__ import annotations

import json
import tempfile
from dataclasses import dataclass
from pathlib import Path

from ..model.tokenization_vanilla_transformer import VanillaTransformerFairseqTokenizer
from .common import ConversionError
from .fairseq_checkpoint import checkpoint_section, flag, language_code


SPECIALS = ("<s>", "<pad>", "</s>", "<unk>")  # fairseq's Dictionary puts these first
SPECIAL_IDS = dict(bos_token_id=0, pad_token_id=1, eos_token_id=2, decoder_start_token_id=2)  # fairseq starts from </s>
OVERWRITE = "#fairseq:overwrite"


def read_dictionary(path: Path) -> list[str]:
    """A fairseq dictionary file (`symbol count` per line) as its symbols in id order, the four specials first."""
    if not path.is_file():
        raise ConversionError(
            f"no dictionary {path.name} beside the checkpoint; give it with --source_dict/--target_dict"
        )
    symbols, seen = list(SPECIALS), set(SPECIALS)
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        parts = line.rstrip().rsplit(" ", 2 if line.rstrip().endswith(OVERWRITE) else 1)
        if len(parts) < 2 or not parts[1].lstrip("-").isdigit():
            raise ConversionError(f"{path.name} line {number} is not 'symbol count': {line[:60]!r}")
        if parts[0] in seen:
            raise ConversionError(f"{path.name} line {number}: the symbol {parts[0]!r} is there twice")
        symbols.append(parts[0])
        seen.add(parts[0])
    return symbols


def fsmt_vocabulary(symbols: list[str]) -> dict[str, int]:
    """fairseq's symbols as FSMTTokenizer's vocabulary: a piece a word goes on after loses its `@@`, a word's last
    piece gets `</w>`; the specials stay as they are; ids unchanged."""
    vocabulary = {}
    for index, symbol in enumerate(symbols):
        if index >= len(SPECIALS):
            symbol = symbol[:-2] if symbol.endswith("@@") else f"{symbol}</w>"
        vocabulary[symbol] = index
    return vocabulary


def read_merges(path: Path) -> list[str]:
    """The merges of subword-nmt codes (`#version: 0.2` first) or fastBPE codes (`a b count`), each pair once (the
    first occurrence ranks, as subword-nmt reads them)."""
    lines = [line for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    if lines and lines[0].startswith("#version:"):
        if lines[0].split()[-1] != "0.2":
            raise ConversionError(f"{path.name} is subword-nmt codes of {lines[0]!r}; FSMT's BPE applies version 0.2")
        pairs = [line.split()[:2] for line in lines[1:]]
    elif all(len(line.split()) == 3 for line in lines):
        pairs = [line.split()[:2] for line in lines]  # fastBPE: pair and count
    else:
        raise ConversionError(
            f"{path.name} has neither subword-nmt's '#version: 0.2' header nor fastBPE's counts: codes of subword-nmt "
            "0.1 join the end-of-word mark differently"
        )
    merges, seen = [], set()
    for pair in pairs:
        if len(pair) != 2:
            raise ConversionError(f"{path.name} holds a line that is no pair of symbols: {' '.join(pair)!r}")
        if tuple(pair) not in seen:
            seen.add(tuple(pair))
            merges.append(" ".join(pair))
    return merges


@dataclass(frozen=True)
class TextPipeline:
    """fairseq's text pipeline as a checkpoint records it: Moses' (source, target) languages and flags, the name the
    BPE codes had in training, and what was assumed where the checkpoint records nothing (for the card)."""

    languages: tuple[str, str]
    moses_no_dash_splits: bool = False
    moses_no_escape: bool = False
    codes_name: str | None = None
    notes: tuple[str, ...] = ()


TOKENIZERS = ("moses",)  # fairseq's --tokenizer choices this tokenizer runs
BPES = ("subword_nmt", "fastbpe")  # fairseq's --bpe choices whose codes it applies (both mark pieces with @@)


def text_pipeline(state: dict, args: dict, languages: tuple) -> TextPipeline:
    """The checkpoint's `--tokenizer` and `--bpe` with their options, or ConversionError naming one this tokenizer
    does not run. `languages` are the model's; Moses' own languages win where the checkpoint gives them."""
    tokenizer, moses = checkpoint_section(state, args, "tokenizer")
    bpe, codes = checkpoint_section(state, args, "bpe")
    notes = []
    if tokenizer is None:
        notes.append("tokenizer: the checkpoint names none (its text was tokenized before training): Moses assumed")
    elif tokenizer not in TOKENIZERS:
        raise ConversionError(f"tokenizer={tokenizer!r}: the converted tokenizer runs fairseq's {TOKENIZERS} only")
    if bpe is None:
        notes.append("BPE: the checkpoint names none (its text was split before training): the codes beside it assumed")
    elif bpe not in BPES:
        raise ConversionError(f"bpe={bpe!r}: the converted tokenizer applies fairseq's {BPES} codes only")
    separator = codes.get("bpe_separator") or "@@"
    if separator != "@@":
        raise ConversionError(f"bpe_separator={separator!r}: FSMT's BPE marks pieces with '@@' only")
    # Moses' languages: fairseq 0.9's --moses-source-lang, later the tokenizer's source_lang (the task's by default).
    sides = [
        language_code(f"{side}_lang", moses.get(f"moses_{side}_lang") or moses.get(f"{side}_lang"))
        for side in ("source", "target")
    ]
    sides = sides if tokenizer is not None else [None, None]
    named = codes.get("bpe_codes") if bpe is not None else None
    return TextPipeline(
        languages=(sides[0] or languages[0], sides[1] or languages[1]),
        moses_no_dash_splits=flag(moses, "moses_no_dash_splits") if tokenizer else False,
        moses_no_escape=flag(moses, "moses_no_escape") if tokenizer else False,
        codes_name=Path(named).name if isinstance(named, str) and named else None,
        notes=tuple(notes),
    )


def bpe_codes_file(folder: Path, given: Path | None, named: str | None = None) -> Path:
    """The BPE codes: `given`, else the file the checkpoint's arguments `named` in training, `bpecodes` or `code`
    (older fairseq's name) in `folder`."""
    names = [name for name in (named, "bpecodes", "code") if name]
    candidates = [given] if given else [folder / name for name in dict.fromkeys(names)]
    for path in candidates:
        if path.is_file():
            return path
    raise ConversionError(
        f"no BPE codes ({' or '.join(p.name for p in candidates)}) beside the checkpoint; give --bpe_codes"
    )


def fairseq_tokenizer(source: list[str], target: list[str], pipeline: TextPipeline, codes: Path | None, folder: Path):
    """A tokenizer giving fairseq's ids: Moses for the pipeline's languages with its flags, the BPE of the codes,
    the two dictionaries."""
    if not all(pipeline.languages):
        raise ConversionError(
            f"the checkpoint's arguments name no source_lang/target_lang ({pipeline.languages}); Moses needs them"
        )
    merges = read_merges(bpe_codes_file(folder, codes, pipeline.codes_name))
    with tempfile.TemporaryDirectory() as scratch:
        files = {"src_vocab_file": "vocab-src.json", "tgt_vocab_file": "vocab-tgt.json", "merges_file": "merges.txt"}
        paths = {key: Path(scratch) / name for key, name in files.items()}
        for key, symbols in (("src_vocab_file", source), ("tgt_vocab_file", target)):
            paths[key].write_text(json.dumps(fsmt_vocabulary(symbols), ensure_ascii=False), encoding="utf-8")
        paths["merges_file"].write_text("".join(f"{merge}\n" for merge in merges), encoding="utf-8")
        try:
            files = {key: str(path) for key, path in paths.items()}
            # FSMT names </s> its separator only; here it is also the end of every sentence, as fairseq appends it.
            return VanillaTransformerFairseqTokenizer(
                langs=list(pipeline.languages),
                eos_token="</s>",
                moses_no_dash_splits=pipeline.moses_no_dash_splits,
                moses_no_escape=pipeline.moses_no_escape,
                **files,
            )
        except ImportError as error:
            raise ConversionError(f"the FSMTTokenizer needs sacremoses ({error}); pip install sacremoses") from error
