"""A fairseq checkpoint as data: read without running any of it, its arguments, and fairseq's booleans read one way.

* **Loading runs no code.** A checkpoint is a pickle; it is read with `torch.load(weights_only=True)`, which builds
  tensors and plain containers only, plus the few classes a fairseq checkpoint holds (`allowed_globals`: the
  `argparse` Namespace of its arguments, numpy's scalars in its training state). Any other class or function the
  pickle names is refused by name, before anything of it runs.
* **Its arguments**: `args` (a Namespace) of checkpoints before fairseq 0.10, `cfg["model"]` of later ones (a
  Namespace again where the model was given on fairseq-train's command line, else a dict); the languages are the
  model's arguments' or, failing them, the task's (`cfg["task"]`).
* **One boolean reader** (`flag`): fairseq's oldest checkpoints hold some booleans as text ("True", "False", which
  its `eval_bool` wrote), so a flag is a bool, that text or 0/1, and read as such wherever it is read.
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import torch

from .common import ConversionError


def allowed_globals() -> list:
    """The classes a fairseq checkpoint's pickle may name besides tensors and containers."""
    import numpy as np

    core = getattr(np, "_core", None) or np.core
    scalar = core.multiarray.scalar
    dtypes = [type(np.dtype(name)) for name in ("float64", "float32", "int64", "int32", "bool")]
    # numpy 2 names its scalar constructor numpy._core.multiarray.scalar; checkpoints pickled under numpy 1 name it
    # numpy.core.multiarray.scalar: both names are the same function.
    return [argparse.Namespace, scalar, (scalar, "numpy.core.multiarray.scalar"), np.dtype, *dtypes]


def load_checkpoint(path: Path) -> dict:
    """The checkpoint's contents, read without running any code: a class or function outside `allowed_globals()`
    is refused (ConversionError naming it)."""
    try:
        with torch.serialization.safe_globals(allowed_globals()):
            state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:
        named = re.search(r"GLOBAL ([\w.]+)", str(error))
        if named:
            raise ConversionError(
                f"{path.name} names {named.group(1)} in its pickle, which a fairseq checkpoint does not need: refused "
                "without running it (allowed: tensors, containers, argparse.Namespace, numpy scalars)"
            ) from None
        raise ConversionError(f"{path.name} cannot be read as a checkpoint: {str(error).splitlines()[0]}") from None
    if not isinstance(state, dict) or not isinstance(state.get("model"), dict):
        raise ConversionError(f"{path.name} has no 'model' weights: not a fairseq checkpoint")
    return state


def checkpoint_arguments(state: dict) -> dict:
    """The model's arguments: `args` (a Namespace) of older checkpoints, `cfg["model"]` of newer ones."""
    args = state.get("args")
    if args is None and isinstance(state.get("cfg"), dict):
        args = state["cfg"].get("model")
    if isinstance(args, argparse.Namespace):
        return vars(args)
    if isinstance(args, dict):
        return args
    raise ConversionError("the checkpoint holds no model arguments (neither 'args' nor cfg['model'])")


def checkpoint_section(state: dict, args: dict, kind: str) -> tuple[str | None, dict]:
    """The name and options of the checkpoint's `kind` ("tokenizer" or "bpe"): `cfg[kind]` of newer checkpoints
    (`{"_name": "moses", ...}`), else the flat arguments (`args[kind]` names it, its options beside it)."""
    cfg = state.get("cfg")
    section = cfg.get(kind) if isinstance(cfg, dict) else None
    if isinstance(section, dict):
        return section.get("_name"), section
    return args.get(kind), args


LANGUAGE = re.compile(r"[A-Za-z0-9_-]+")  # a language code as fairseq's file names hold it: en, pt_BR, zh-cn


def checkpoint_languages(state: dict, args: dict) -> tuple[str | None, str | None]:
    """(source, target) language: the model's arguments', else the task's (`cfg["task"]`). They name the dictionaries
    beside the checkpoint (`dict.en.txt`), so anything but a language code is refused (no path in a file name)."""
    cfg = state.get("cfg")
    task = cfg.get("task") if isinstance(cfg, dict) else None
    task = vars(task) if isinstance(task, argparse.Namespace) else task if isinstance(task, dict) else {}
    sides = ("source", "target")
    return tuple(language_code(f"{side}_lang", args.get(f"{side}_lang") or task.get(f"{side}_lang")) for side in sides)


def language_code(key: str, value):
    """`value` (the argument `key`) where it is a language code or None; anything else is refused, naming it."""
    if value is not None and not (isinstance(value, str) and LANGUAGE.fullmatch(value)):
        raise ConversionError(f"{key}={value!r} is not a language code such as 'en' or 'pt_BR'")
    return value


TRUE, FALSE = ("true", "1"), ("false", "0", "none", "")


def flag(args: dict, key: str, default: bool = False) -> bool:
    """The boolean argument `key` (`default` where the checkpoint lacks it): a bool, 0 or 1, or the text fairseq's
    oldest checkpoints hold ("True", "False"). Anything else is refused, naming it."""
    value = args.get(key, default)
    if value is None or isinstance(value, bool):
        return bool(value)
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    if isinstance(value, str) and value.strip().lower() in TRUE + FALSE:
        return value.strip().lower() in TRUE
    raise ConversionError(f"{key}={value!r} is not a boolean; expected True or False")
