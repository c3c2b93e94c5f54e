"""What a run may publish of its command line and of the paths it read (results.json, the model card, the Hub): no
token and no home path. The value of `--hub_token` (or of `--hub_tok`, an abbreviation earlier versions took), of
any other `*_token` flag (`--flag value` or `--flag=value`) and anything shaped like a Hugging Face token (`hf_...`)
becomes `REDACTED`; a local path becomes its place in the output folder where it lies inside it, else its file or
folder name (`/home/alice/data/mine.tsv`: `mine.tsv`); a home folder left anywhere else in a text becomes `~`. The
Hub's own tools never write a token into a repository either. training/ (results.json) and sharing/ (the card, the
upload) both call this one module.
"""

from __future__ import annotations

import dataclasses
import os
import re
import shlex
from collections.abc import Iterable
from pathlib import Path


REDACTED = "REDACTED"
# A Hugging Face user access token: "hf_" and 34 letters or digits (older ones "api_"); any such word is hidden.
HF_TOKEN = re.compile(r"\b(?:hf|api)_[A-Za-z0-9]{20,}\b")
# Characters that end a path quoted in a sentence ("recipe /home/alice/r.yaml on a CPU", "{'file': '/data/x'}").
PATH_END = r"[^\s'\"`,;()\[\]{}]*"


# The shortest prefix of `--hub_token` that argparse took for it before flags had to be written in full
# (utils/command_line.py): a command line recorded by an earlier version may hold `--hub_tok VALUE`.
HUB_TOKEN_PREFIX = "hub_t"


def is_secret_flag(flag: str) -> bool:
    """Whether the command-line flag `flag` (`--hub_token`, `--hub-token`, `--token`, or an abbreviation of
    `--hub_token` that earlier versions took, `--hub_tok`) carries a secret."""
    name = flag.lstrip("-").replace("-", "_").lower()
    return (
        name == "token"
        or name.endswith("_token")
        or (name.startswith(HUB_TOKEN_PREFIX) and "hub_token".startswith(name))
    )


def looks_like_path(text: str) -> bool:
    """Whether `text` names a local file or folder: absolute, under `~`, or with a folder part that goes up (`..`) or
    exists here. A Hub id (`user/model`) that is no local folder is not one."""
    if text.startswith(("/", "~")):
        return True
    return "/" in text and (".." in Path(text).parts or os.path.exists(text))


def public_path(path: str, output_dir: str | Path | None = None) -> str:
    """`path` as it may be published: relative to `output_dir` where it lies inside it (`checkpoint-20`), else its
    last part: a file's name, a folder's name (the output folder itself included)."""
    where = Path(os.path.abspath(os.path.expanduser(path)))
    if output_dir is not None:
        root = Path(os.path.abspath(os.path.expanduser(str(output_dir))))
        if where != root and where.is_relative_to(root):
            return where.relative_to(root).as_posix()
    return where.name or path


def public_value(value: str, output_dir: str | Path | None = None) -> str:
    """A flag's value with each comma-separated local path in it made public (`src.txt,tgt.txt`)."""
    return ",".join(public_path(part, output_dir) if looks_like_path(part) else part for part in value.split(","))


def public_command(command: str, output_dir: str | Path | None = None) -> str:
    """The command line `command` (as `shlex.join` writes it) with the value of every secret flag `REDACTED`, every
    token-shaped word too, and every local path made public (`public_path`)."""
    try:
        words = shlex.split(command)
    except ValueError:  # not a shell line (an unclosed quote): its words as they are
        words = command.split()
    public, secret_next = [], False
    for word in words:
        if secret_next and not word.startswith("--"):
            public.append(REDACTED)
            secret_next = False
            continue
        secret_next = False
        flag, equals, value = word.partition("=") if word.startswith("-") else ("", "", word)
        if flag and is_secret_flag(flag):
            public.append(f"{flag}={REDACTED}" if equals else flag)
            secret_next = not equals
        elif flag:
            public.append(f"{flag}={public_value(value, output_dir)}" if equals else word)
        else:
            public.append(public_value(word, output_dir))
    return HF_TOKEN.sub(REDACTED, shlex.join(public))


def private_paths(*arguments) -> list[str]:
    """The local paths among the fields of the dataclasses `arguments` (a run's recipe and training arguments): its
    recipe file, data files, output and cache folders, a model folder... (comma-separated lists split)."""
    found = []
    for holder in arguments:
        for field in dataclasses.fields(holder):
            value = getattr(holder, field.name, None)
            if isinstance(value, (str, Path)):
                found += [part for part in str(value).split(",") if looks_like_path(part)]
    return found


def publishable(value, paths: Iterable[str] = (), output_dir: str | Path | None = None):
    """`value` (JSON-like: dicts, lists, strings) with every string made publishable: each of the local `paths`
    (given or absolute) and what lies under it made public (`public_path`), token-shaped words `REDACTED`, the home
    folder left anywhere else written `~`."""
    forms = {form for path in paths for form in (str(path), os.path.abspath(os.path.expanduser(str(path))))}
    forms = sorted((form for form in forms if looks_like_path(form)), key=len, reverse=True)
    pattern = "|".join(rf"(?<![\w./-]){re.escape(form.rstrip('/'))}(?:/{PATH_END})?(?![\w.-])" for form in forms)
    found = re.compile(pattern) if forms else None
    home = str(Path.home()).rstrip("/")

    def scrub(text: str) -> str:
        if found is not None:
            text = found.sub(lambda match: public_path(match.group(0), output_dir), text)
        text = HF_TOKEN.sub(REDACTED, text)
        return re.sub(rf"(?<![\w./-]){re.escape(home)}(?=/|\b)", "~", text) if len(home) > 1 else text

    def walk(item):
        if isinstance(item, str):
            return scrub(item)
        if isinstance(item, dict):
            return {key: walk(inner) for key, inner in item.items()}
        if isinstance(item, (list, tuple)):
            return [walk(inner) for inner in item]
        return item

    return walk(value)
