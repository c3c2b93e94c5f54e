"""Publish a trained model folder to the Hugging Face Hub, in one commit.

Usage:
    vanilla-transformer push MODEL_DIR REPO_ID [--private] [--dry-run] [--token TOKEN]
    vanilla-transformer push MODEL_DIR REPO_ID --format marian [--onnx]   # a stock MarianMTModel: no remote code

With `--format marian` the folder is first exported as a stock MarianMTModel folder (`vanilla-transformer export
--format marian`, with its ONNX graphs for transformers.js with `--onnx`) and that folder goes up: config, weights,
tokenizer, generation config and its card, no code at all (docs/sharing.md says when to pick which). A Marian folder
exported before is published the same way, given as MODEL_DIR.

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
import tempfile
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
    parser.add_argument(
        "--format",
        choices=["folder", "marian"],
        default="folder",
        help="folder: as trained (remote code); marian: exported as a stock MarianMTModel first (no remote code)",
    )
    parser.add_argument("--onnx", action="store_true", help="with --format marian: its ONNX graphs too")
    options = parser.parse_args(argv)
    if options.onnx and options.format != "marian":
        parser.error("--onnx applies to --format marian only")
    with tempfile.TemporaryDirectory(prefix="marian-export-") as exported:
        try:
            folder = _exported(options.model_dir, exported, options.onnx) if options.format == "marian" else None
        except (OSError, ValueError, ImportError, RuntimeError) as error:  # the export's: one line
            print(f"error: {str(error).strip().splitlines()[0]}", file=sys.stderr)
            return 1
        return _push(options, folder or options.model_dir)


def _exported(model_dir: str, folder: str, onnx: bool) -> str:
    """The model folder exported as a MarianMTModel folder under the temporary `folder`, named as the model."""
    from ..convert.marian_export import export_marian

    return str(export_marian(model_dir, Path(folder) / Path(model_dir).resolve().name, onnx=onnx))


def _push(options, model_dir: str) -> int:
    try:
        plan, url = push_model_folder(
            model_dir,
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
