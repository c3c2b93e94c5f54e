"""The configuration files shipped with the package, found wherever it is installed (`importlib.resources`, never a
path into a clone; the repository's top-level `configs/` is a link to this folder):

recipes/      training recipes (cpu, gpu: the main job; base, big: the paper; finetune: a saved model continued, over
              the machine's), the flags' defaults
accelerate/   `accelerate launch` files: single_node_multi_gpu, multi_node, fsdp
"""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path


FOLDER = Path(str(files(__name__)))
KINDS = ("recipes", "accelerate")


def config_files(kind: str) -> dict[str, Path]:
    """The shipped files of `kind` ("recipes" or "accelerate") by name (their stem)."""
    if kind not in KINDS:
        raise ValueError(f"{kind!r} is not a kind of shipped configuration; expected one of {KINDS}.")
    return {path.stem: path for path in sorted((FOLDER / kind).glob("*.yaml"))}
