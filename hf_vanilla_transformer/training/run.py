"""A whole training run, as `scripts/train.py` and `scripts/main.py` start it: prepare (corpus, tokenizer, model, plan,
Trainer), train, average the last checkpoints (§6.1), choose the GNMT α on the validation split, translate the test
split with the paper's beam search, and leave a complete model folder with `results.json`, plots and a model card.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import logging
import shutil
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import TrainerState

from ..evaluation.length_penalty import choose_alpha
from ..evaluation.translation import evaluate_translations
from ..sharing.model_card import write_model_card
from ..sharing.plots import write_run_plots
from ..utils.distributed import main_process_value
from ..utils.faults import moment
from ..utils.files import disk_full, folder_bytes, is_disk_full, write_json_atomically
from ..utils.locks import FolderInUseError, folder_lock
from .arguments import ModelDataArguments, TransformerTrainingArguments
from .averaging import average_last_checkpoints
from .calibration import Measurement, Timing
from .checkpoints import checkpoint_folders, checkpoint_step, latest_checkpoint, validate_checkpoint
from .choices import length_penalty_choices
from .plan_record import remove_plan, write_plan
from .preparation import PreparedRun, prepare_run
from .results import RunOutcome, publishes_examples, run_results
from .run_data import PreparedData


logger = logging.getLogger(__name__)


def plot_sentence(sources: list[str]) -> str:
    """A test sentence of readable length (6-20 words) for the attention maps; else the first one."""
    return next((text for text in sources if 6 <= len(text.split()) <= 20), sources[0])


def train_and_evaluate(
    recipe: ModelDataArguments,
    args: TransformerTrainingArguments,
    command: str = "",
    examples: int = 5,
    started: float | None = None,
) -> dict | None:
    """Train, average the last checkpoints, evaluate on the test split with beam search, and leave a complete model
    folder in `args.output_dir`: weights, config, generation config, tokenizer, remote-code files, `results.json`,
    `training_log.json`, plots and a `README.md` model card. Resumes from the newest complete checkpoint of the
    folder. Under several processes all of them train; the main process does the rest and returns the results,
    the others return None. A time budget (`max_minutes`) counts from `started` (`time.time()`; the scripts pass
    their process's start, interpreter start-up included), else from this call: a notebook or a test session that
    calls it has been running for longer than the run.
    """
    started = time.time() if started is None else started
    with _run_lock(args):
        results = _train_and_evaluate(recipe, args, command, examples, started)
    leave_process_group()  # after the trainer is gone: see leave_process_group
    return results


@contextmanager
def _run_lock(args: TransformerTrainingArguments):
    """The output folder's lock (utils/locks.py), held by the main process for the whole run; every process stops
    with the main process's error where another run holds it."""
    with contextlib.ExitStack() as stack:
        refused = None
        if args.should_save:
            try:
                stack.enter_context(folder_lock(args.output_dir, logger))
            except FolderInUseError as error:
                refused = error
        refused = main_process_value(refused)
        if refused is not None:
            raise refused
        yield


def _train_and_evaluate(
    recipe: ModelDataArguments, args: TransformerTrainingArguments, command: str, examples: int, started: float
) -> dict | None:
    # The main process picks the checkpoint to resume from and every process takes the same one (on several
    # machines, output_dir must be storage they share: only the main process writes checkpoints).
    resume = main_process_value(args.resume_from_checkpoint or latest_checkpoint(args.output_dir))
    if resume:
        validate_checkpoint(resume)
        logger.info("resuming from %s", resume)
    run = prepare_run(recipe, args, resume=resume, started=started)
    if args.should_save:
        print(f"Plan: {run.plan.summary()}.", flush=True)
    train_started = time.time()
    if resume is not None and checkpoint_step(resume) >= run.plan.max_steps:
        # Killed after its last update (while averaging or writing the folder): nothing is left to train (the
        # Trainer would take one more update), the state is the checkpoint's.
        run.trainer.state = TrainerState.load_from_json(str(Path(resume) / "trainer_state.json"))
    else:
        run.trainer.train(resume_from_checkpoint=resume)
    if run.budget.switch is not None:  # the first updates proved the calibrated choice wrong: start again
        restart, data = restart_of(run), run.data
        run.trainer.accelerator.free_memory()
        del run  # the first model and Trainer go before the second are built (the data stays)
        gc.collect()
        run = start_again(restart, started, data)
        run.trainer.train()
    train_seconds = time.time() - train_started
    if not args.should_save:
        # Averaging, the test decoding and the model folder are the main process's work; the others are done.
        return None
    outcome = RunOutcome(started, train_seconds, resumed_at=resume, command=command, examples=examples)
    return finish_run(run, outcome)


@dataclass
class Restart:
    """What a run started again with another choice needs of the first: the user's recipe, the switched one, the
    arguments, the update time the Trainer measured (applied to the switch's calibration), what it switched from."""

    asked: ModelDataArguments
    recipe: ModelDataArguments
    args: TransformerTrainingArguments
    known: Measurement
    switched_from: dict


def restart_of(run: PreparedRun) -> Restart:
    """The restart the budget callback's switch asks for: its preset and batch size, the first run's precision and
    attention, its time known rather than measured again."""
    switch, previous = run.budget.switch, run.budget.plan
    recipe = dataclasses.replace(
        run.recipe,
        preset=switch["preset"],
        preset_choices=None,
        max_tokens=switch["max_tokens"],
        max_tokens_choices=None,
        precision=previous.precision,
        attn_implementation=previous.attn_implementation,
        compile_training="always" if previous.torch_compile else "never",
        # the peak keeps its owner: the size the user named it for, not the one switched to
        peak_learning_rate_preset=run.recipe.peak_learning_rate_preset or run.recipe.preset,
    )
    known = Measurement(
        previous.precision,
        previous.attn_implementation,
        previous.torch_compile,
        per_size={switch["max_tokens"]: Timing(switch["seconds_per_update"] / switch["accumulation"])},
        reasons=[f"{previous.precision}, {previous.attn_implementation} attention, as calibrated"],
    )
    switched_from = {
        "preset": previous.preset,
        "max_tokens": previous.max_tokens,
        "calibrated_seconds_per_update": previous.seconds_per_update,
        "measured_seconds_per_update": run.budget.meter.seconds_per_update,
        "at": run.trainer.state.global_step,
    }
    return Restart(run.recipe, recipe, run.args, known, switched_from)


def start_again(restart: Restart, started: float, data: PreparedData) -> PreparedRun:
    """The new run of `restart`, with the rest of the budget: a new model, plan and Trainer on the `data` already
    prepared. The first run saved nothing (a switch comes before the first checkpoint); its plan is replaced, the
    switch recorded in the new one."""
    args = restart.args
    if args.should_save:  # the first choice's plan and any checkpoint of it (a timed save) are not ones to keep
        remove_plan(args.output_dir)
        for folder in checkpoint_folders(args.output_dir, complete_only=False):
            shutil.rmtree(folder)
    main_process_value(None)  # every process waits until they are gone
    again = prepare_run(restart.recipe, args, started=started, known=restart.known, data=data)
    again.budget.plan = dataclasses.replace(again.budget.plan, switched_from=restart.switched_from)
    if args.should_save:
        write_plan(args.output_dir, again.budget.plan)
        print(f"Plan, started again: {again.plan.summary()}.", flush=True)
    return dataclasses.replace(again, recipe=restart.asked)  # results.json records what the user asked for


def finish_run(run: PreparedRun, outcome: RunOutcome) -> dict:
    """The main process's work after training: average, choose alpha, score the test split, write the folder. The
    folder is complete once `results.json` is there (written last); killed before, the same command does it all
    again from the last checkpoint. A device that fills up is named (`DiskFullError`)."""
    try:
        return _finish_run(run, outcome)
    except Exception as error:
        if not is_disk_full(error, run.args.output_dir):
            raise
        needed = 3 * folder_bytes(Path(outcome.averaged[-1])) // 2 if outcome.averaged else None
        raise disk_full(run.args.output_dir, needed, "the model folder") from error


def _finish_run(run: PreparedRun, outcome: RunOutcome) -> dict:
    recipe, trainer, output_dir = run.recipe, run.trainer, Path(run.args.output_dir)
    # The model's files are written again below: a results.json of an earlier run (a finished run started again, or
    # given more updates) no longer marks the folder complete until this run writes its own.
    (output_dir / "results.json").unlink(missing_ok=True)
    # 1. Average the last checkpoints into the model folder (§6.1).
    model, outcome.averaged = average_last_checkpoints(
        output_dir,
        output_dir,
        last=recipe.average_last,
        window=recipe.average_window,
        log_history=trainer.state.log_history,
    )
    run.tokenizer.save_pretrained(output_dir)
    model.to(trainer.args.device)
    moment("model-folder", output_dir)

    # 2. The GNMT alpha of the beam search, chosen on the validation pairs where the recipe asks for it (§6.1).
    decode_started = time.time()
    alphas = length_penalty_choices(recipe)
    outcome.alpha_choice = choose_alpha(
        alphas, model, run.tokenizer, run.corpus, recipe.max_eval_samples, recipe.test_beams
    )
    if outcome.alpha_choice is not None:  # the model folder keeps the chosen alpha
        model.generation_config.length_penalty = outcome.alpha_choice["chosen"]
        model.generation_config.save_pretrained(output_dir)

    # 3. Test BLEU with the paper's beam search.
    test = run.corpus["test"] if "test" in run.corpus else run.corpus["validation"]
    outcome.sources, outcome.references = list(test["source"]), list(test["target"])
    outcome.scores, outcome.hypotheses = evaluate_translations(
        model, run.tokenizer, outcome.sources, outcome.references, num_beams=recipe.test_beams
    )
    outcome.decode_seconds = time.time() - decode_started
    outcome.length_penalty = model.generation_config.length_penalty

    # 4. Log, plots, card, and results.json last: the mark of a complete folder.
    results = run_results(run, model, outcome)
    log = trainer.state.log_history
    write_json_atomically(output_dir / "training_log.json", {"log_history": log})
    sentence = plot_sentence(outcome.sources) if publishes_examples(recipe) else None  # None: no attention maps
    plots = write_run_plots(model, run.tokenizer, log, output_dir / "plots", sentence)
    write_model_card(output_dir, results, plots=[str(path.relative_to(output_dir)) for path in plots])
    write_json_atomically(output_dir / "results.json", results)
    return results


def leave_process_group() -> None:
    """End this process's part in a multi-process launch (nothing to do in a single process). Call it once the
    run's trainer is unreachable.

    The order matters under gloo: a DDP reducer keeps a reference to the process group, and if the reducer drops
    the last one, the group's destructor runs with the GIL held and joins gloo's worker threads, which may be
    waiting for the GIL to free the tensors of the last collective (Trainer's final all-gather): a hang, or an
    abort when it happens at interpreter exit. So the trainer goes first (collected here), then the group, whose
    last reference is dropped from Python, whose binding releases the GIL while the threads stop.
    """
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        gc.collect()
        torch.distributed.destroy_process_group()
