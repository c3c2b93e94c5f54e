"""Publishing a model folder to the Hugging Face Hub: what it publishes (weights, tokenizer, remote code, the card,
the plots, the translation pipeline's code), the checks before anything is uploaded, and the one commit."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from pathlib import Path

from ..data.tokenizer import TOKENIZER_FILES
from ..model import REMOTE_CODE_FILES
from ..utils.redact import public_command, publishable
from .model_card import render_model_card


# What a model folder publishes: these files as they are; config.json with the pipeline added; the card rendered for
# the repository; plots/*.png; the pipeline's code. Training leftovers (checkpoint-*/, the tokenizer/ copy used for
# resuming) stay home.
COPIED = (
    "generation_config.json",
    "model.safetensors",
    *TOKENIZER_FILES,
    "results.json",
    "training_log.json",
    *REMOTE_CODE_FILES,
)
REQUIRED = (
    "config.json",
    "model.safetensors",
    "tokenizer.json",
    *REMOTE_CODE_FILES,
)


class PublishError(RuntimeError):
    """The folder cannot be published, or the Hub cannot be reached; the message says why and what to do."""


def _transport_errors() -> tuple[type[BaseException], ...]:
    """The exceptions a failed connection raises: OSError (huggingface_hub's own, OfflineModeIsEnabled among them)
    and the TransportError of its HTTP client, which is none (httpx2 for huggingface_hub 2, httpx for 1)."""
    import importlib

    errors: list[type[BaseException]] = [OSError]
    for module in ("httpx2", "httpx"):
        with contextlib.suppress(ImportError):
            errors.append(importlib.import_module(module).TransportError)
    return tuple(errors)


def check_model_card(text: str):
    """Parse a model card with `huggingface_hub` and check the metadata the Hub needs for a translation model.

    Returns the `ModelCard`; raises `PublishError` naming the missing or malformed field.
    """
    from huggingface_hub import ModelCard

    try:
        card = ModelCard(text)
        results = card.data.eval_results or []
    except Exception as error:  # the YAML or the model-index does not parse
        raise PublishError(f"The model card's metadata is malformed: {error}") from error
    data = card.data
    problems = []
    if data.pipeline_tag != "translation":
        problems.append(f"pipeline_tag is {data.pipeline_tag!r}, expected 'translation'")
    if not isinstance(data.language, list) or len(data.language) < 2:
        problems.append(f"language is {data.language!r}, expected the source and target languages")
    if not data.license:
        problems.append("license is missing")
    if "translation" not in (data.tags or []):
        problems.append(f"tags {data.tags!r} lack 'translation'")
    if not any(result.metric_type == "bleu" for result in results):
        problems.append("the model-index holds no BLEU result")
    if problems:
        raise PublishError("The model card's metadata is incomplete: " + "; ".join(problems) + ".")
    return card


def stage_for_hub(model_dir: str | Path, staging_dir: str | Path, repo_id: str | None = None) -> list[Path]:
    """Copy what `model_dir` publishes into `staging_dir`, ready to upload: the files of `COPIED`, the plots, the
    translation pipeline's code named in `config.json` (`custom_pipelines`), and a model card whose usage examples
    name `repo_id`. Returns the staged files. Raises `PublishError` if the folder is not a complete model folder.
    """
    import inspect
    import json
    import shutil

    from ..model.pipeline_vanilla_transformer import VanillaTranslationPipeline

    model_dir, staging_dir = Path(model_dir), Path(staging_dir)
    if not model_dir.is_dir():
        raise PublishError(f"{model_dir} is not a folder; expected a model folder written by training.")
    missing = [name for name in REQUIRED if not (model_dir / name).exists()]
    if missing:
        raise PublishError(
            f"{model_dir} is not a complete model folder: {', '.join(missing)} missing. Publish the output folder "
            "of scripts/train.py or scripts/main.py (or a folder written by save_pretrained)."
        )
    config = json.loads((model_dir / "config.json").read_text(encoding="utf-8"))
    if "AutoModelForSeq2SeqLM" not in config.get("auto_map", {}):
        raise PublishError(f"{model_dir / 'config.json'} has no auto_map; save the model with the package imported.")
    foreign = foreign_code(model_dir)
    if foreign:
        raise PublishError(
            f"{model_dir} names code that is not this package's, which trust_remote_code=True would run: "
            f"{'; '.join(foreign)}. Fine-tune or convert it again with this version (it keeps none), or remove them."
        )
    staging_dir.mkdir(parents=True, exist_ok=True)
    staged = []
    for name in COPIED:
        if (model_dir / name).exists():
            staged.append(Path(shutil.copy2(model_dir / name, staging_dir / name)))
    for plot in sorted((model_dir / "plots").glob("*.png")):
        (staging_dir / "plots").mkdir(exist_ok=True)
        staged.append(Path(shutil.copy2(plot, staging_dir / "plots" / plot.name)))
    # The pipeline travels with the model: its file, and its registration (__init__.py) in the config, written as
    # Pipeline.save_pretrained writes it: the class named in that file, the model classes by name.
    source = Path(inspect.getfile(VanillaTranslationPipeline))
    staged.append(Path(shutil.copy2(source, staging_dir / source.name)))
    config["custom_pipelines"] = {
        task: {**info, "impl": f"{source.stem}.{info['impl'].__name__}", "pt": [model.__name__ for model in info["pt"]]}
        for task, info in VanillaTranslationPipeline._registered_impl.items()
    }
    (staging_dir / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    staged.append(staging_dir / "config.json")
    # The card: rendered again from the results so that its examples name the repository, else the folder's own.
    card = staging_dir / "README.md"
    if (model_dir / "results.json").exists():
        results = public_results(json.loads((model_dir / "results.json").read_text(encoding="utf-8")), model_dir)
        text = json.dumps(results, indent=2, ensure_ascii=False) + "\n"
        (staging_dir / "results.json").write_text(text, encoding="utf-8")
        plots = [str(path.relative_to(staging_dir)) for path in staged if path.parent.name == "plots"]
        card.write_text(render_model_card(results, repo_id=repo_id, plots=plots), encoding="utf-8")
    elif (model_dir / "README.md").exists():
        shutil.copy2(model_dir / "README.md", card)
    else:
        raise PublishError(f"{model_dir} has neither results.json nor README.md: there is no model card to publish.")
    check_model_card(card.read_text(encoding="utf-8"))
    staged.append(card)
    return sorted(staged)


OWN_CODE = {Path(name).stem for name in (*REMOTE_CODE_FILES, "tokenization_vanilla_transformer.py")}


def foreign_code(model_dir: Path) -> list[str]:
    """What config.json and tokenizer_config.json name as code to run (`auto_map`) that is not one of this package's
    files, written `file: Auto class -> reference` (a folder converted or fine-tuned by an earlier version kept a
    source's own)."""
    import json

    found = []
    for name in ("config.json", "tokenizer_config.json"):
        path = model_dir / name
        auto_map = json.loads(path.read_text(encoding="utf-8")).get("auto_map") if path.exists() else None
        for auto, references in (auto_map or {}).items():
            for reference in references if isinstance(references, list) else [references]:
                if reference is not None and str(reference).split(".")[0] not in OWN_CODE:
                    found.append(f"{name}: {auto} -> {reference}")
    return found


def public_results(results: dict, model_dir: str | Path) -> dict:
    """A folder's `results.json` as the Hub gets it, whatever version of the package wrote it: its command line
    without tokens or local paths, no home folder anywhere (utils/redact.py), and no test sentences of the user's own
    files unless the run was asked to publish them (`--publish_examples`)."""
    command = public_command(results.get("command", ""), model_dir)
    results = publishable({**results, "command": command}, [str(model_dir)], model_dir)
    own_data = results.get("data", {}).get("dataset") == "local files"
    if own_data and not results.get("recipe", {}).get("publish_examples"):
        results["examples"] = []
    return results


def upload_plan(staging_dir: str | Path) -> list[tuple[str, int]]:
    """(path in the repository, size in bytes) of every staged file, sorted by path."""
    staging_dir = Path(staging_dir)
    return sorted(
        (path.relative_to(staging_dir).as_posix(), path.stat().st_size)
        for path in staging_dir.rglob("*")
        if path.is_file()
    )


def commit_operations(staging_dir: str | Path, plan: list[tuple[str, int]] | None = None) -> list:
    """One `CommitOperationAdd` per staged file (those of `plan`, by default `upload_plan(staging_dir)`): the whole
    folder goes up in a single commit, or not at all."""
    from huggingface_hub import CommitOperationAdd

    staging_dir = Path(staging_dir)
    if plan is None:
        plan = upload_plan(staging_dir)
    return [CommitOperationAdd(path_in_repo=path, path_or_fileobj=str(staging_dir / path)) for path, _ in plan]


def push_model_folder(
    model_dir: str | Path,
    repo_id: str,
    private: bool = False,
    token: str | None = None,
    dry_run: bool = False,
    commit_message: str = "Upload Transformer trained with hf_vanilla_transformer",
    say: Callable[[str], None] | None = None,
) -> tuple[list[tuple[str, int]], str | None]:
    """Publish a model folder as the Hub model repository `repo_id` in one commit.

    Returns (the upload plan, the commit URL or None for a dry run). A dry run stages and checks everything and
    touches no network. Without a token, or when the Hub cannot be reached, raises `PublishError` before anything
    is uploaded; the single commit means a failure never leaves a half-uploaded repository. Before uploading, `say`
    (the push command's `print`) gets one line saying whether the repository will be public or private.
    """
    import tempfile

    from huggingface_hub.utils import HFValidationError, validate_repo_id

    try:
        if not isinstance(repo_id, str):
            raise HFValidationError(f"not a string but {type(repo_id).__name__}")
        validate_repo_id(repo_id)
    except HFValidationError as error:
        raise PublishError(
            f"repo_id={repo_id!r} is invalid: expected 'name' or 'user-or-organisation/name' ({error})"
        ) from error
    with tempfile.TemporaryDirectory(prefix="hub-staging-") as staging:
        stage_for_hub(model_dir, staging, repo_id=repo_id)
        plan = upload_plan(staging)
        if dry_run:
            return plan, None
        from huggingface_hub import HfApi, get_token
        from huggingface_hub.errors import HfHubHTTPError

        token = token or get_token()
        if not token:
            raise PublishError(
                "No Hugging Face token: run `hf auth login`, set HF_TOKEN, or pass --token. Nothing was uploaded."
            )
        api = HfApi(token=token)
        try:
            if say is not None:
                say(f"Publishing {Path(model_dir).name} to {repo_id}: {visibility(api, repo_id, private)}.")
            url = api.create_repo(repo_id, private=private, exist_ok=True, repo_type="model")
            commit = api.create_commit(
                repo_id=url.repo_id,
                operations=commit_operations(staging, plan),
                commit_message=commit_message,
                repo_type="model",
            )
        except HfHubHTTPError as error:  # an OSError too: before the transport errors
            raise PublishError(f"The Hub refused the upload to {repo_id}: {error}. Nothing was committed.") from error
        except _transport_errors() as error:  # no network, DNS failures, timeouts, offline
            raise PublishError(
                f"Cannot reach the Hugging Face Hub ({error.__class__.__name__}: {error}). Nothing was uploaded; "
                "check the network (or HF_ENDPOINT) and try again."
            ) from error
        return plan, commit.commit_url


def visibility(api, repo_id: str, private: bool) -> str:
    """Whether the repository `repo_id` will be public, in words: an existing one keeps its visibility (`--private`
    does not change it), a new one is private only with `private`."""
    from huggingface_hub.errors import RepositoryNotFoundError

    try:
        existing = api.repo_info(repo_id, repo_type="model")
    except RepositoryNotFoundError:
        if private:
            return "a new private repository"
        return "a new PUBLIC repository, which anyone can read (--private keeps it to you)"
    if existing.private:
        return "an existing private repository"
    return "an existing PUBLIC repository, which anyone can read" + (
        " (--private does not change it)" if private else ""
    )
