"""The commands' argument parsers: every flag written in full, and a word no flag takes named without its value.

argparse takes any unambiguous prefix of a flag by default (`--hub_tok VALUE` for `--hub_token VALUE`), and a
redaction that reads a command line (utils/redact.py) knows flags by their names: an abbreviated secret flag would be
recorded, and published, as it was typed. So abbreviations are turned off (`allow_abbrev=False`) for every parser the
package builds, and a flag the parser does not know is refused by its name alone: its value may be a secret, and the
error goes to a terminal or a log.
"""

from __future__ import annotations

import argparse


class CommandParser(argparse.ArgumentParser):
    """An `ArgumentParser` for a command: its docstring as the description (kept as written), flags only in full,
    and unknown words refused without repeating their values (`unknown_words`)."""

    def __init__(self, prog: str, description: str | None, **kwargs):
        kwargs.setdefault("formatter_class", argparse.RawDescriptionHelpFormatter)
        super().__init__(prog=prog, description=description, allow_abbrev=False, **kwargs)

    def parse_args(self, args=None, namespace=None):
        namespace, extras = self.parse_known_args(args, namespace)
        if extras:
            self.error(unknown_words(extras, self))
        return namespace


def unknown_words(extras: list[str], parser: argparse.ArgumentParser) -> str:
    """What a parser left of a command line (`extras`), in words that repeat no value: each unknown flag by its name
    (with the flags it begins, where it is a prefix of some), the other words only counted."""
    flags = [word.split("=", 1)[0] for word in extras if word.startswith("-")]
    known = sorted(option for option in parser._option_string_actions if option.startswith("--"))
    parts = []
    for flag in flags:
        meant = [option for option in known if option.startswith(flag)][:3]
        parts.append(f"unrecognized flag {flag}" + (f" (did you mean {' or '.join(meant)}?)" if meant else ""))
    if len(extras) > len(flags):
        parts.append(f"{len(extras) - len(flags)} word(s) that no flag takes")
    return "; ".join(parts) + ". Flags are written in full (no abbreviations): see --help."
