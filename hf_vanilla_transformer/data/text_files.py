"""The lines of a local text file, read with a bound: at most `LONGEST_LINE` bytes of a line are ever held in
memory, so that a file without line ends (a multi-gigabyte binary, a corpus whose newlines were lost) or a line of
megabytes costs no more than a normal one. A longer line is skipped unread, past its end, and said (None) for the
caller to count (data/corpora.py counts it with the lines that are no sentence pair)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from .splits import DataFileError


LONGEST_SIDE = 20_000  # characters: a sentence, even a long paragraph, is far shorter; a megabyte line is no pair
# Bytes of a line read at most: two longest sides of 4-byte characters, with room for JSON's escapes and keys.
LONGEST_LINE = 16 * LONGEST_SIDE
SKIP_CHUNK = 1 << 20  # bytes read at a time past the bound of an over-long line


def text_lines(path: Path) -> Iterator[tuple[int, str | None]]:
    """(line number, line without its end) of a UTF-8 file, read as a stream, or (line number, None) for a line of
    more than `LONGEST_LINE` bytes, skipped. Bytes that are not UTF-8 raise a DataFileError naming the file, the line
    and the byte."""
    with Path(path).open("rb") as handle:
        number = 0
        while raw := handle.readline(LONGEST_LINE + 1):
            number += 1
            if len(raw) > LONGEST_LINE and not raw.endswith(b"\n"):
                while raw and not raw.endswith(b"\n"):  # the rest of the line, a chunk at a time, dropped
                    raw = handle.readline(SKIP_CHUNK)
                yield number, None
                continue
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as error:
                raise DataFileError(
                    f"{path}:{number} is not UTF-8 text (byte {raw[error.start]:#04x}: {error.reason}); expected a "
                    "UTF-8 text file."
                ) from None
            yield number, line.rstrip("\r\n")
