"""The main process's work after training, steps 6-9 of a run (`run.py`): 6. average the last checkpoints into the
model folder (§6.1), keeping the starting model of a fine-tuning run where training made it worse (`start.py`),
7. choose the GNMT alpha on the validation split (§6.1), 8. translate the test split with the paper's beam search,
9. write the log, plots, model card and `results.json` (last: the mark of a complete folder)."""

from __future__ import annotations

import time
from contextlib import contextmanager
from pathlib import Path

from ..data.tokenizer import save_tokenizer
from ..evaluation.length_penalty import choose_alpha
from ..evaluation.translation import evaluate_translations
from ..sharing.model_card import write_model_card
from ..sharing.plots import write_run_plots
from ..utils.faults import moment
from ..utils.files import disk_full, folder_bytes, is_disk_full, write_json_atomically
from .averaging import average_last_checkpoints, averaging_for
from .budget import TrainingEnd, updates_per_epoch
from .building import Training
from .results import RunOutcome, run_results
from .run_data import PreparedData
from .settings import RunSettings
from .start import keep_the_better


def averaging_of_run(settings: RunSettings, training: Training) -> tuple[int, float, dict | None]:
    """The checkpoints the run averages, the last fraction of it they come from, and the rule that chose them as
    `results.json` names it: where the epochs it made reach a step of the recipe's `average_last_by_epochs`, that
    step's count, the window widened to hold them from the last checkpoint back (a run stopped early by its plateau
    or deadline too); else the recipe's `average_last` and `average_window`, and no rule. The plan predicted the same
    from its epochs (its time, its line); the end decides on those made, and says so in place of the prediction."""
    recipe, trainer = settings.recipe, training.trainer
    steps, args = trainer.state.global_step, trainer.args
    epochs = steps / updates_per_epoch(len(trainer.batch_sampler), args.gradient_accumulation_steps, args.world_size)
    spacing = training.budget.plan.schedule.save_steps or args.save_steps
    chosen = averaging_for(settings.averaging_steps, epochs, spacing, steps, recipe.average_window)
    if chosen is None:
        return recipe.average_last, recipe.average_window, None
    said = f"the last {chosen[0]} checkpoints averaged ({epochs:.1f} epochs made)"
    return *chosen, {"rule": "average_last_by_epochs", "said": said}


def plot_sentence(sources: list[str]) -> str:
    """A test sentence of readable length (6-20 words) for the attention maps; else the first one."""
    return next((text for text in sources if 6 <= len(text.split()) <= 20), sources[0])


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
        lap = _Lap(outcome.finishing)
        # 6. Average the last checkpoints into the model folder (§6.1).
        last, window, outcome.averaging = averaging_of_run(settings, training)
        model, outcome.averaged = average_last_checkpoints(
            output_dir, output_dir, last, window, trainer.state.log_history
        )
        save_tokenizer(data.tokenizer, output_dir)  # the keys its class defines only (no source's auto_map)
        model.to(trainer.args.device)
        lap("averaging")
        if outcome.start is not None:  # never worse than the model it started from
            model, outcome.kept = keep_the_better(model, settings, data, outcome.start, output_dir)
            lap("start_check")
        moment("model-folder", output_dir)
        # 7. The GNMT alpha of the beam search, chosen on the validation pairs where the recipe asks for it (§6.1).
        outcome.alpha_choice = choose_alpha(
            list(settings.alphas), model, data.tokenizer, data.corpus, recipe.max_eval_samples, recipe.test_beams
        )
        if outcome.alpha_choice is not None:  # the model folder keeps the chosen alpha
            model.generation_config.length_penalty = outcome.alpha_choice["chosen"]
            model.generation_config.save_pretrained(output_dir)
        lap("alpha")
        # 8. Test BLEU with the paper's beam search.
        outcome.sources, outcome.references = list(data.test["source"]), list(data.test["target"])
        outcome.scores, outcome.hypotheses = evaluate_translations(
            model, data.tokenizer, outcome.sources, outcome.references, num_beams=recipe.test_beams
        )
        outcome.length_penalty = model.generation_config.length_penalty
        lap("test")
        # 9. Log, plots, card, and results.json last: the mark of a complete folder.
        log = trainer.state.log_history
        write_json_atomically(output_dir / "training_log.json", {"log_history": log})
        sentence = plot_sentence(outcome.sources) if settings.publishes_examples else None  # None: no attention maps
        plots = write_run_plots(model, data.tokenizer, log, output_dir / "plots", sentence)
        lap("folder")
        results = run_results(settings, data, training, end, model, outcome)
        write_model_card(output_dir, results, plots=[str(path.relative_to(output_dir)) for path in plots])
        write_json_atomically(output_dir / "results.json", results)
    return results


class _Lap:
    """Each call records the seconds since the previous one (or since it was made) under its name in `into`."""

    def __init__(self, into: dict):
        self.into, self.mark = into, time.time()

    def __call__(self, name: str) -> None:
        now = time.time()
        self.into[name] = now - self.mark
        self.mark = now


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
