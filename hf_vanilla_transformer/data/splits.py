"""What a corpus is here: the three splits every corpus has (the LibreOffice corpora split by file, a lone training
file with validation and test pairs held out, WMT14's own), and the error raised when one cannot be built."""

from __future__ import annotations


SPLITS = ("train", "validation", "test")


class CorpusError(RuntimeError):
    """A corpus cannot be built here; the message says what to run or which source to use instead."""


class DataFileError(ValueError):
    """A data file breaks its format (bytes that are not UTF-8, a line that is no TSV or JSONL record, two aligned
    files of different lengths); the message names the file and the line."""
