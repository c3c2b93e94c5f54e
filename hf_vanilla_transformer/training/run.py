"""A whole training run, as `scripts/train.py` and `scripts/main.py` start it, top to bottom:

1. settle: the recipe and flags as one frozen `RunSettings` (`settings.settle`; the caller's, before any work);
2. data: corpus, tokenizer, tokenized training split, batches (`run_data.prepare_data`), once;
3. plan: the model of the first choice and the plan (`budget.planner.make_plan`: measured to fit the budget, or
   the one a checkpoint recorded);
4. Trainer: the plan's model, arguments and callbacks (`building.build_trainer`);
5. train, acting on what the budget's callback returns: a switch to another choice goes back to 3 with the same
   data (once at most);
6. average the last checkpoints (§6.1), 7. choose the GNMT alpha on the validation split (§6.1), 8. translate the
   test split with the paper's beam search, 9. leave a complete model folder: `results.json`, plots, a model card
   (`finishing.finish_run`, the main process's work).
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

from transformers import TrainerState

from ..sharing.plots import attention_map_panels
from ..utils.distributed import leave_process_group, main_process_value
from ..utils.locks import FolderInUseError, folder_lock
from ..utils.stages import SetupClock
from .budget import BudgetClock, Switch, TrainingEnd, finishing_seconds, make_plan, remove_plan
from .building import Training, build_trainer
from .checkpoints import checkpoint_folders, checkpoint_step, latest_checkpoint, validate_checkpoint
from .finishing import finish_run
from .models import build_model
from .results import RunOutcome
from .run_data import PreparedData, prepare_data
from .settings import RunSettings
from .start import starting_point
from .trainer import TransformerTrainer


logger = logging.getLogger(__name__)


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
    leave_process_group()  # after the trainer is gone: see utils/distributed.leave_process_group
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
    clock.check_setup({})  # a budget spent before the set-up begins stops the run before the corpus is read
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
        settings = settings.for_start(start)  # its peak and warmup, where the recipe sets them by the start's score
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
    outcome = RunOutcome(
        started,
        train_seconds,
        resumed_at=resume,
        command=command,
        examples=examples,
        start=start,
        set_up_seconds=train_started - started,
    )
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
    # From here the averaging and the folder keep the chosen model's own seconds (its measured checkpoint), not the
    # margin the plan kept before it had one: the first re-plan gives the difference to training.
    checkpoint, panels = budgeted.plan.costs.checkpoint_seconds, attention_map_panels(model.config)
    averaged = budgeted.plan.choice.average_last or recipe.average_last  # what its predicted epochs average
    clock = clock.with_finishing(finishing_seconds(checkpoint, averaged, panels))
    return build_trainer(settings, budgeted, model, data, clock)


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
    clock.check_setup({})
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
