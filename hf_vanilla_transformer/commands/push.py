"""Publish a trained model folder to the Hugging Face Hub, in one commit.

Usage:
    vanilla-transformer push MODEL_DIR REPO_ID [--private] [--dry-run] [--token TOKEN]

What goes up: the weights (safetensors), config.json (with `auto_map` and the translation pipeline in
`custom_pipelines`), the remote-code files (configuration, modeling, pipeline), the tokenizer, the generation config,
the model card (README.md, rendered for REPO_ID and checked with huggingface_hub), results.json, training_log.json
and the plots. Checkpoints and other training leftovers stay home. Only regular files inside MODEL_DIR are read: a
symbolic link, a hard link to a file outside, or a training_log.json that is not the run's is refused in one line
naming it and left out (the push stops where the model needs it). `--dry-run` lists exactly the files that would go
up, with their sizes, says what it refused, and touches no network. Without a token (`hf auth login` or HF_TOKEN)
or without a network the script stops with a message before anything is uploaded. Before uploading it says in one
line whether the repository will be public (a new repository is, unless --private) or private. results.json and the
card go up without tokens or local paths, and without test sentences of your own data unless training was asked to
publish them (docs/security.md).
"""

import sys
from pathlib import Path

from ..sharing.hub import PublishError, push_model_folder
from ..utils.command_line import CommandParser


def human(size: int) -> str:
    unit = "B"
    for larger in ("KiB", "MiB", "GiB"):
        if size < 1024:
            break
        size, unit = size / 1024, larger
    return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"


def main(argv: list[str] | None = None, prog: str | None = None) -> int:
    prog = prog or Path(sys.argv[0]).name
    parser = CommandParser(prog, __doc__)
    parser.add_argument(
        "model_dir", help="a model folder written by vanilla-transformer train or vanilla-transformer main"
    )
    parser.add_argument("repo_id", help="the Hub repository, e.g. your-name/transformer-en-de")
    parser.add_argument("--private", action="store_true", help="create the repository as private")
    parser.add_argument("--dry-run", action="store_true", help="list what would be uploaded; no network")
    parser.add_argument("--token", help="a Hugging Face token (default: the one of `hf auth login` or HF_TOKEN)")
    options = parser.parse_args(argv)
    try:
        plan, url = push_model_folder(
            options.model_dir,
            options.repo_id,
            private=options.private,
            token=options.token,
            dry_run=options.dry_run,
            say=lambda line: print(line, flush=True),
        )
    except PublishError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    width = max(len(path) for path, _ in plan)
    print(("Would upload" if options.dry_run else "Uploaded") + f" to {options.repo_id} ({len(plan)} files):")
    for path, size in plan:
        print(f"  {path:<{width}}  {human(size):>10}")
    print(f"  {'total':<{width}}  {human(sum(size for _, size in plan)):>10}")
    if url:
        print(f"Commit: {url}")
    return 0
