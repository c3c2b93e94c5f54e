"""A whole training run, as `scripts/train.py` and `scripts/main.py` start it, top to bottom:

1. settle: the recipe and flags as one frozen `RunSettings` (`settings.settle`; the caller's, before any work);
2. data: corpus, tokenizer, tokenized training split, batches (`run_data.prepare_data`), once;
3. plan: the model of the first choice and the plan (`budget.planner.make_plan`: measured to fit the budget, or
   the one a checkpoint recorded);
4. Trainer: the plan's model, arguments and callbacks (`building.build_trainer`);
5. train, acting on what the budget's callback returns: a switch to another choice goes back to 3 with the same
   data (once at most);
6. average the last checkpoints (§6.1), 7. choose the GNMT alpha on the validation split (§6.1), 8. translate the
   test split with the paper's beam search, 9. leave a complete model folder: `results.json`, plots, a model card.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import shutil
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import TrainerState

from ..data.tokenizer import save_tokenizer
from ..evaluation.length_penalty import choose_alpha
from ..evaluation.translation import evaluate_translations
from ..sharing.model_card import write_model_card
from ..sharing.plots import write_run_plots
from ..utils.distributed import main_process_value
from ..utils.faults import moment
from ..utils.files import disk_full, folder_bytes, is_disk_full, write_json_atomically
from ..utils.locks import FolderInUseError, folder_lock
from ..utils.stages import SetupClock
from .averaging import average_last_checkpoints
from .budget import BudgetClock, Switch, TrainingEnd, make_plan, remove_plan
from .building import Training, build_trainer
from .checkpoints import checkpoint_folders, checkpoint_step, latest_checkpoint, validate_checkpoint
from .models import build_model
from .results import RunOutcome, run_results
from .run_data import PreparedData, prepare_data
from .settings import RunSettings
from .start import keep_the_better, starting_point
from .trainer import TransformerTrainer


logger = logging.getLogger(__name__)


def plot_sentence(sources: list[str]) -> str:
    """A test sentence of readable length (6-20 words) for the attention maps; else the first one."""
    return next((text for text in sources if 6 <= len(text.split()) <= 20), sources[0])


def train_and_evaluate(
    settings: RunSettings, command: str = "", examples: int = 5, started: float | None = None
) -> dict | None:
    """Train, average the last checkpoints, evaluate on the test split with beam search, and leave a complete model
    folder in the output folder: weights, config, generation config, tokenizer, remote-code files, `results.json`,
    `training_log.json`, plots and a `README.md` model card, for the settled run `settings` (`settings.settle`).
    Resumes from the newest complete checkpoint of the folder. Under several processes all of them train; the main
    process does the rest and returns the results, the others return None. A time budget (`max_minutes`) counts
    from `started` (`time.time()`; the scripts pass their process's start, interpreter start-up included), else
    from this call: a notebook or a test session that calls it has been running for longer than the run.
    """
    started = time.time() if started is None else started
    with _run_lock(settings.args):
        results = _train_and_evaluate(settings, command, examples, started)
    leave_process_group()  # after the trainer is gone: see leave_process_group
    return results


@contextmanager
def _run_lock(args):
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


def _train_and_evaluate(settings: RunSettings, command: str, examples: int, started: float) -> dict | None:
    args = settings.args
    Path(args.output_dir).mkdir(parents=True, exist_ok=True)
    clock = BudgetClock.starting(started, settings.max_minutes)
    # The main process picks the checkpoint to resume from and every process takes the same one (on several
    # machines, output_dir must be storage they share: only the main process writes checkpoints).
    resume = main_process_value(args.resume_from_checkpoint or latest_checkpoint(args.output_dir))
    if resume:
        validate_checkpoint(resume)
        logger.info("resuming from %s", resume)
    # 2. The data, once; a saved model to continue measured before its first update (`training/start.py`).
    data = prepare_data(settings, clock, SetupClock(started, rank=args.process_index))
    start = None
    if settings.recipe.model_name_or_path:  # fine-tuning: the main process measures, every process waits for it
        with data.clock.stage("starting point"):
            start = main_process_value(starting_point(settings, data))
    if start is not None:  # measured again at the end, in the budget: twice its time (a worse model decodes longer)
        clock = clock.with_final_check(2 * start["seconds"])
    # 3-5. Plan, Trainer, train; a switch to another choice goes back to the plan with the same data.
    training = prepare_training(settings, data, clock, resume)
    train_started = time.time()
    end = train(training, resume)
    if end.switch is not None:
        settings = settings.switched_to(end.switch.preset, end.switch.max_tokens, *end.switch.update)
        training.trainer.accelerator.free_memory()
        training = None  # the first model and Trainer go before the second are built (the data stays)
        gc.collect()
        _forget_first_choice(args)
        training = prepare_training(settings, data, clock, restart=end.switch)
        end = train(training)
    train_seconds = time.time() - train_started
    if not args.should_save:
        # Averaging, the test decoding and the model folder are the main process's work; the others are done.
        return None
    outcome = RunOutcome(started, train_seconds, resumed_at=resume, command=command, examples=examples, start=start)
    return finish_run(settings, data, training, end, outcome)


def prepare_training(
    settings: RunSettings,
    data: PreparedData,
    clock: BudgetClock,
    resume: str | None = None,
    restart: Switch | None = None,
) -> Training:
    """3. The plan, with the model of its choice, and 4. its Trainer: the plan the checkpoint `resume` recorded where
    given, else made to fit the budget (the choice `restart` a first run switched to, where given)."""
    recipe, seed = settings.recipe, settings.args.seed
    with data.clock.stage("model"):
        model = build_model(recipe, data.tokenizer, settings.presets[0], seed=seed)
    with data.clock.stage("plan"):
        budgeted = make_plan(
            settings,
            data,
            model,
            clock,
            resume,
            restart,
            build=lambda preset: build_model(recipe, data.tokenizer, preset),
            trainer_class=TransformerTrainer,
        )
        if (
            budgeted.plan.choice.preset and budgeted.plan.choice.preset != settings.presets[0]
        ):  # the plan chose another size
            model = build_model(recipe, data.tokenizer, budgeted.plan.choice.preset, seed=seed)
    training = build_trainer(settings, budgeted, model, data, clock)
    if settings.args.should_save:
        print(f"Plan{', started again' if restart else ''}: {budgeted.plan.summary()}.", flush=True)
    return training


def train(training: Training, resume: str | None = None) -> TrainingEnd:
    """5. Training, from the checkpoint `resume` where given; how it ended, as the budget's callback says."""
    trainer, plan = training.trainer, training.budget.plan
    if resume is not None and checkpoint_step(resume) >= plan.schedule.max_steps:
        # Killed after its last update (while averaging or writing the folder): nothing is left to train (the
        # Trainer would take one more update), the state is the checkpoint's.
        trainer.state = TrainerState.load_from_json(str(Path(resume) / "trainer_state.json"))
    else:
        trainer.train(resume_from_checkpoint=resume)
    return training.budget.end()


@dataclass
class PreparedRun:
    """A run ready to train, for a notebook or a test: its settings, its data, its Trainer and the plan it holds."""

    settings: RunSettings
    data: PreparedData
    training: Training

    @property
    def trainer(self):
        return self.training.trainer

    @property
    def plan(self):
        return self.training.budget.plan

    @property
    def tokenizer(self):
        return self.data.tokenizer

    @property
    def corpus(self):
        return self.data.corpus


def prepare_run(settings: RunSettings, started: float | None = None, resume: str | None = None) -> PreparedRun:
    """Steps 2 to 4 of a run (data, plan, Trainer), ready for `train(run.training)`; its budget counts from
    `started` (default: now)."""
    started = time.time() if started is None else started
    Path(settings.output_dir).mkdir(parents=True, exist_ok=True)
    clock = BudgetClock.starting(started, settings.max_minutes)
    data = prepare_data(settings, clock, SetupClock(started, rank=settings.args.process_index))
    return PreparedRun(settings, data, prepare_training(settings, data, clock, resume))


def _forget_first_choice(args) -> None:
    """The first choice's plan and any checkpoint of it (a timed save) removed: they are not ones to keep (a switch
    comes before the first spaced checkpoint)."""
    if args.should_save:
        remove_plan(args.output_dir)
        for folder in checkpoint_folders(args.output_dir, complete_only=False):
            shutil.rmtree(folder)
    main_process_value(None)  # every process waits until they are gone


def finish_run(
    settings: RunSettings, data: PreparedData, training: Training, end: TrainingEnd, outcome: RunOutcome
) -> dict:
    """The main process's work after training: 6. average, 7. choose alpha, 8. score the test split, 9. write the
    folder. The folder is complete once `results.json` is there (written last); killed before, the same command does
    it all again from the last checkpoint. A device that fills up is named (`DiskFullError`)."""
    recipe, trainer, output_dir = settings.recipe, training.trainer, Path(settings.output_dir)
    with _full_device_named(output_dir, outcome):
        # The model's files are written again below: a results.json of an earlier run (a finished run started
        # again, or given more updates) no longer marks the folder complete until this run writes its own.
        (output_dir / "results.json").unlink(missing_ok=True)
        # 6. Average the last checkpoints into the model folder (§6.1).
        model, outcome.averaged = average_last_checkpoints(
            output_dir, output_dir, recipe.average_last, recipe.average_window, trainer.state.log_history
        )
        save_tokenizer(data.tokenizer, output_dir)  # the keys its class defines only (no source's auto_map)
        model.to(trainer.args.device)
        if outcome.start is not None:  # never worse than the model it started from
            model, outcome.kept = keep_the_better(model, settings, data, outcome.start, output_dir)
        moment("model-folder", output_dir)
        # 7. The GNMT alpha of the beam search, chosen on the validation pairs where the recipe asks for it (§6.1).
        decode_started = time.time()
        outcome.alpha_choice = choose_alpha(
            list(settings.alphas), model, data.tokenizer, data.corpus, recipe.max_eval_samples, recipe.test_beams
        )
        if outcome.alpha_choice is not None:  # the model folder keeps the chosen alpha
            model.generation_config.length_penalty = outcome.alpha_choice["chosen"]
            model.generation_config.save_pretrained(output_dir)
        # 8. Test BLEU with the paper's beam search.
        outcome.sources, outcome.references = list(data.test["source"]), list(data.test["target"])
        outcome.scores, outcome.hypotheses = evaluate_translations(
            model, data.tokenizer, outcome.sources, outcome.references, num_beams=recipe.test_beams
        )
        outcome.decode_seconds = time.time() - decode_started
        outcome.length_penalty = model.generation_config.length_penalty
        # 9. Log, plots, card, and results.json last: the mark of a complete folder.
        results = run_results(settings, data, training, end, model, outcome)
        log = trainer.state.log_history
        write_json_atomically(output_dir / "training_log.json", {"log_history": log})
        sentence = plot_sentence(outcome.sources) if settings.publishes_examples else None  # None: no attention maps
        plots = write_run_plots(model, data.tokenizer, log, output_dir / "plots", sentence)
        write_model_card(output_dir, results, plots=[str(path.relative_to(output_dir)) for path in plots])
        write_json_atomically(output_dir / "results.json", results)
    return results


@contextmanager
def _full_device_named(output_dir: Path, outcome: RunOutcome):
    """A device that fills up while the model folder is written, named with the space the folder needs."""
    try:
        yield
    except Exception as error:
        if not is_disk_full(error, output_dir):
            raise
        needed = 3 * folder_bytes(Path(outcome.averaged[-1])) // 2 if outcome.averaged else None
        raise disk_full(output_dir, needed, "the model folder") from error


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
