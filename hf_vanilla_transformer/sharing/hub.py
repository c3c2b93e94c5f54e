"""Publishing a model folder to the Hugging Face Hub: what it publishes (weights, tokenizer, remote code, the card,
the plots, the translation pipeline's code), the checks before anything is uploaded (what is read of the folder, and
how: reading.py), and the one commit."""

from __future__ import annotations

import contextlib
import json
import logging
import re
from collections.abc import Callable
from pathlib import Path

from ..data.tokenizer import TOKENIZER_FILES
from ..model import REMOTE_CODE_FILES
from ..utils.redact import public_command, publishable
from .model_card import render_model_card
from .reading import PNG, ModelFolder, RefusedFile, json_object, open_model_folder, training_log


logger = logging.getLogger(__name__)

# What a model folder publishes: these files as they are (training_log.json once read as the run writes it);
# config.json with the pipeline added; the card rendered for the repository; plots/*.png; the pipeline's code. Each
# only as a regular file inside the folder (sharing/reading.py). Training leftovers (checkpoint-*/, the tokenizer/
# copy used for resuming) stay home.
COPIED = (
    "generation_config.json",
    "model.safetensors",
    *TOKENIZER_FILES,
    "results.json",
    "training_log.json",
    *REMOTE_CODE_FILES,
)
REQUIRED = ("config.json", "model.safetensors", "tokenizer.json")
# The code files a folder needs: these two, and every sibling they import relatively (`code_files_needed`: a folder
# saved before the layers had a file of their own holds them in its modeling file).
CODE_ROOTS = ("configuration_vanilla_transformer.py", "modeling_vanilla_transformer.py")

# The code a published repository may name in an `auto_map`: the modules the upload holds, this package's own.
OWN_CODE = frozenset(
    Path(name).stem
    for name in (*REMOTE_CODE_FILES, *TOKENIZER_FILES, "pipeline_vanilla_transformer.py")
    if name.endswith(".py")
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


def stage_for_hub(
    model_dir: str | Path, staging_dir: str | Path, repo_id: str | None = None
) -> tuple[list[Path], list[str]]:
    """Copy what `model_dir` publishes into `staging_dir`, ready to upload: the files of `COPIED`, the plots, the
    translation pipeline's code named in `config.json` (`custom_pipelines`), and a model card whose usage examples
    name `repo_id`. Only regular files inside the folder are read, never through a link (sharing/reading.py).

    Returns (the staged files, one line for each file refused and left out, naming it). Raises `PublishError` if the
    folder is not a complete model folder, or a file it needs is refused.
    """
    model_dir, staging_dir = Path(model_dir), Path(staging_dir)
    try:
        folder = open_model_folder(model_dir)
    except (NotADirectoryError, FileNotFoundError):
        raise PublishError(f"{model_dir} is not a folder; expected a model folder written by training.") from None
    except OSError as error:
        raise PublishError(f"Cannot open {model_dir}: {error.strerror}. Nothing was uploaded.") from None
    try:
        with folder:
            return _stage(folder, staging_dir, repo_id)
    except RefusedFile as error:  # a file the model cannot go without
        raise PublishError(f"Cannot publish {model_dir}: {error}. Nothing was uploaded.") from None
    except OSError as error:  # a file that cannot be read (its permissions), a full disk under the staging folder
        where = f" ({error.filename})" if error.filename else ""
        raise PublishError(f"Cannot publish {model_dir}: {error.strerror}{where}. Nothing was uploaded.") from None


# What a stock MarianMTModel folder (`export --format marian`) publishes: no code at all, its card as it is.
MARIAN_COPIED = (
    "config.json",
    "generation_config.json",
    "model.safetensors",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "source.spm",  # a converted opus-mt model's own MarianTokenizer
    "target.spm",
    "vocab.json",
    "README.md",
)


def _stage_marian(folder: ModelFolder, staging_dir: Path) -> tuple[list[Path], list[str]]:
    """`stage_for_hub` for a MarianMTModel folder: its files of `MARIAN_COPIED` and its ONNX graphs (`onnx/`), no
    code (a config or tokenizer config naming some is refused), the card checked as the package's own is."""
    missing = [name for name in ("model.safetensors", "README.md") if not folder.exists(name)]
    if not folder.exists("tokenizer.json") and not folder.exists("source.spm"):
        missing.append("tokenizer.json (or a MarianTokenizer's source.spm)")
    if missing:
        raise PublishError(f"{folder.path} is not a complete Marian folder: {', '.join(missing)} missing.")
    for name in ("config.json", "tokenizer_config.json"):
        if folder.exists(name) and folder.json(name).get("auto_map"):
            raise PublishError(
                f"{folder.path / name} names code (auto_map): a Marian folder needs none. Nothing was uploaded."
            )
    onnx = [f"onnx/{name}" for name in folder.names("onnx")]
    staged = []
    for name in [*MARIAN_COPIED, *(name for name in onnx if name.endswith((".onnx", ".onnx_data")))]:
        staged += _stage_file(folder, name, staging_dir / name)
    check_model_card((staging_dir / "README.md").read_text(encoding="utf-8"))
    return sorted(staged), []


def _stage(folder: ModelFolder, staging_dir: Path, repo_id: str | None) -> tuple[list[Path], list[str]]:
    """`stage_for_hub` on the open folder: what is required checked first, then each file staged or refused."""
    if folder.exists("config.json") and folder.json("config.json").get("model_type") == "marian":
        staging_dir.mkdir(parents=True, exist_ok=True)
        return _stage_marian(folder, staging_dir)
    missing = [name for name in REQUIRED if not folder.exists(name)]
    missing += [name for name in code_files_needed(folder) if not folder.exists(name)]
    if missing:
        raise PublishError(
            f"{folder.path} is not a complete model folder: {', '.join(missing)} missing. Publish the output folder "
            "of scripts/train.py or scripts/main.py (or a folder written by save_pretrained)."
        )
    config = folder.json("config.json")
    if "AutoModelForSeq2SeqLM" not in config.get("auto_map", {}):
        raise PublishError(f"{folder.path / 'config.json'} has no auto_map; save the model with the package imported.")
    check_own_code("config.json", config)
    staging_dir.mkdir(parents=True, exist_ok=True)
    refused = []
    try:
        plots = [f"plots/{name}" for name in folder.names("plots") if name.endswith(".png")]
    except RefusedFile as error:
        plots = []
        refused.append(not_uploaded(error))
    staged = []
    for name in [*(name for name in COPIED if name != "results.json"), *plots]:
        try:
            staged += _stage_file(folder, name, staging_dir / name)
        except RefusedFile as error:
            if name in REQUIRED or name in REMOTE_CODE_FILES:
                raise
            refused.append(not_uploaded(error))
    staged += _pipeline(config, staging_dir)
    # The card: rendered again from the results so that its examples name the repository, else the folder's own.
    plots = [str(path.relative_to(staging_dir)) for path in staged if path.parent.name == "plots"]
    staged += _card(folder, staging_dir, repo_id, plots, refused)
    return sorted(staged), refused


def not_uploaded(error: RefusedFile) -> str:
    """The line that says a file was refused and left out of the upload, and why."""
    return f"Not uploaded: {error}."


def _stage_file(folder: ModelFolder, name: str, target: Path) -> list[Path]:
    """The file `name` of the folder copied to `target` (none where the folder has no such file): as it is, a plot
    only if it is a PNG, `training_log.json` written again once read as the run writes it (`reading.training_log`).
    Raises RefusedFile naming it where push does not read it."""
    if not folder.exists(name):
        return []
    target.parent.mkdir(parents=True, exist_ok=True)
    if name == "tokenizer_config.json":  # written as read, once its code is known to be this package's
        text = folder.text(name)
        check_own_code(name, json_object(name, text))
        target.write_text(text, encoding="utf-8")
    elif name == "training_log.json":
        log = folder.json(name)
        try:
            training_log(log)
        except ValueError as error:
            raise RefusedFile(name, f"not the log the run writes: {error}") from None
        target.write_text(json.dumps(log, indent=2) + "\n", encoding="utf-8")
    else:
        folder.copy(name, target, starts_with=PNG if name.startswith("plots/") else b"")
    return [target]


def check_own_code(name: str, config: dict) -> None:
    """Refuse a config (`config.json`, `tokenizer_config.json`) whose `auto_map` names code other than this
    package's modules (`OWN_CODE`): another repository's code (`owner/repo--module.Class`), or any module but
    these, would run on every machine that loads the repository with `trust_remote_code=True`, as the card says to."""
    auto_map = config.get("auto_map") or {}
    named = []  # each class: "module.Class", or a tokenizer's [slow, fast] with None for a missing one
    for value in auto_map.values() if isinstance(auto_map, dict) else [auto_map]:
        named += [item for item in (value if isinstance(value, list) else [value]) if item is not None]
    foreign = [item for item in named if not isinstance(item, str) or item.rpartition(".")[0] not in OWN_CODE]
    if foreign:
        raise PublishError(
            f"{name}'s auto_map names code that is not this package's ({', '.join(map(str, foreign[:3]))}): it would "
            "run wherever the repository is loaded with trust_remote_code=True. Nothing was uploaded; publish a folder "
            "whose auto_map names only this package's files (a converted source's tokenizer config can carry one)."
        )


def _pipeline(config: dict, staging_dir: Path) -> list[Path]:
    """The pipeline travels with the model: its file, and its registration in the config, written as
    Pipeline.save_pretrained writes it: the class named in that file, the model classes by name."""
    import inspect
    import shutil

    from ..model.pipeline_vanilla_transformer import VanillaTranslationPipeline

    source = Path(inspect.getfile(VanillaTranslationPipeline))
    shutil.copy2(source, staging_dir / source.name)
    config["custom_pipelines"] = {
        task: {**info, "impl": f"{source.stem}.{info['impl'].__name__}", "pt": [model.__name__ for model in info["pt"]]}
        for task, info in VanillaTranslationPipeline._registered_impl.items()
    }
    (staging_dir / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    return [staging_dir / source.name, staging_dir / "config.json"]


def _card(folder: ModelFolder, staging_dir: Path, repo_id: str | None, plots: list[str], refused: list[str]) -> list:
    """The model card (README.md), rendered from results.json (staged too, without tokens or paths:
    `public_results`), else the folder's own README.md; checked with huggingface_hub. A refused results.json is
    said in `refused`."""
    card, results = staging_dir / "README.md", None
    try:
        results = folder.json("results.json") if folder.exists("results.json") else None
    except RefusedFile as error:
        refused.append(not_uploaded(error))
    if results is not None:
        results = public_results(results, folder.path)
        text = json.dumps(results, indent=2, ensure_ascii=False) + "\n"
        (staging_dir / "results.json").write_text(text, encoding="utf-8")
        card.write_text(render_model_card(results, repo_id=repo_id, plots=plots), encoding="utf-8")
    elif folder.exists("README.md"):
        card.write_text(folder.text("README.md"), encoding="utf-8")
    else:
        raise PublishError(f"{folder.path} has neither results.json nor README.md: there is no model card to publish.")
    check_model_card(card.read_text(encoding="utf-8"))
    return [card] if results is None else [card, staging_dir / "results.json"]


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
    (the push command's `print`; by default the log's warnings) gets one line for each file refused and left out
    (a link, a hard link to a file outside, a log that is not the run's: sharing/reading.py), a dry run too, then
    one line saying whether the repository will be public or private.
    """
    import tempfile

    check_repo_id(repo_id)
    with tempfile.TemporaryDirectory(prefix="hub-staging-") as staging:
        _, refused = stage_for_hub(model_dir, staging, repo_id=repo_id)
        for line in refused:
            (say or logger.warning)(line)
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


def code_files_needed(folder: ModelFolder) -> list[str]:
    """The code files `folder` needs to load with `trust_remote_code=True`: `CODE_ROOTS` and the siblings they import
    relatively (`from .name import`), as its own files name them (a root it lacks: needed, and not read)."""
    needed, waiting = [], list(CODE_ROOTS)
    while waiting:
        name = waiting.pop(0)
        if name in needed:
            continue
        needed.append(name)
        if name in REMOTE_CODE_FILES and folder.exists(name):
            waiting += [f"{module}.py" for module in re.findall(r"^from \.(\w+) import", folder.text(name), re.M)]
    return needed


def check_repo_id(repo_id) -> None:
    """A PublishError naming `repo_id` where the Hub would refuse it."""
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    try:
        if not isinstance(repo_id, str):
            raise HFValidationError(f"not a string but {type(repo_id).__name__}")
        validate_repo_id(repo_id)
    except HFValidationError as error:
        raise PublishError(
            f"repo_id={repo_id!r} is invalid: expected 'name' or 'user-or-organisation/name' ({error})"
        ) from error


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
