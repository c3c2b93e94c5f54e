"""A fairseq model's dictionaries and BPE codes as files a transformers tokenizer loads: `FSMTTokenizer`'s
vocab-src.json, vocab-tgt.json and merges.txt, as transformers wrote them for fairseq's WMT19 systems, read by
`VanillaTransformerFairseqTokenizer` (FSMT's tokenizer without its punctuation normalisation, which fairseq's Moses
tokenizer does not do: model/tokenization_vanilla_transformer.py).

fairseq tokenizes with Moses, splits words with subword-nmt's BPE (`lo@@ w`: `@@` marks a piece that a word goes on
after) and looks the pieces up in its dictionary, whose first four symbols are `<s>`, `<pad>`, `</s>`, `<unk>`.
`FSMTTokenizer` does the same with the end of a word marked instead (`lo w</w>`), so each dictionary symbol is
renamed (`lo@@` -> `lo`, `w` -> `w</w>`) and keeps its id; the merges are the codes without their counts.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

from ..model.tokenization_vanilla_transformer import VanillaTransformerFairseqTokenizer
from .common import ConversionError


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


def bpe_codes_file(folder: Path, given: Path | None) -> Path:
    """The BPE codes: `given`, else `bpecodes` or `code` (older fairseq's name) in `folder`."""
    candidates = [given] if given else [folder / "bpecodes", folder / "code"]
    for path in candidates:
        if path.is_file():
            return path
    raise ConversionError(
        f"no BPE codes ({' or '.join(p.name for p in candidates)}) beside the checkpoint; give --bpe_codes"
    )


def fairseq_tokenizer(source: list[str], target: list[str], languages: tuple, codes: Path | None, folder: Path):
    """A tokenizer giving fairseq's ids: Moses for `languages`, the BPE of the codes, the two dictionaries."""
    if not all(languages):
        raise ConversionError(
            f"the checkpoint's arguments name no source_lang/target_lang ({languages}); Moses needs them"
        )
    merges = read_merges(bpe_codes_file(folder, codes))
    with tempfile.TemporaryDirectory() as scratch:
        files = {"src_vocab_file": "vocab-src.json", "tgt_vocab_file": "vocab-tgt.json", "merges_file": "merges.txt"}
        paths = {key: Path(scratch) / name for key, name in files.items()}
        for key, symbols in (("src_vocab_file", source), ("tgt_vocab_file", target)):
            paths[key].write_text(json.dumps(fsmt_vocabulary(symbols), ensure_ascii=False), encoding="utf-8")
        paths["merges_file"].write_text("".join(f"{merge}\n" for merge in merges), encoding="utf-8")
        try:
            files = {key: str(path) for key, path in paths.items()}
            # FSMT names </s> its separator only; here it is also the end of every sentence, as fairseq appends it.
            return VanillaTransformerFairseqTokenizer(langs=list(languages), eos_token="</s>", **files)
        except ImportError as error:
            raise ConversionError(f"the FSMTTokenizer needs sacremoses ({error}); pip install sacremoses") from error
