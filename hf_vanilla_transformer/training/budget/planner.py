"""Making a run's plan (`make_plan`, the budget room's one entry point) and the `Planner` that measures and fits it.

A budgeted run measures each model size of the recipe in turn (largest first): its precision, attention,
compilation and the time of a batch at each batch size (`calibration.py`), the Trainer's own work beyond that
update (`trainer_speed.py`, once), and the number of updates that fits the time left at each batch size once the
checkpoints, validations, the test decoding and the first update of each new batch shape are paid for; it keeps the
first size whose fit reaches `min_updates` (else the last), and the largest batch size that does. A run of a given
length measures only what the recipe leaves open. The schedule follows from the length (`schedule.py`).
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from ...utils.distributed import main_process_value, result_or_error
from ...utils.machine import describe_device
from .calibration import Calibration, Measurement, Timing, measure_checkpoint_seconds
from .clock import BudgetClock, BudgetError
from .costs import BudgetFit, BudgetRules, decoding_steps, updates_that_fit, validation_decoding_steps
from .decode_speed import measure_decode_step, median_batch
from .device import pad_multiple
from .plan import Budgeted, BudgetPlan
from .record import complete_recorded_plan, recorded_plan, write_plan
from .replanning import Switch
from .schedule import (
    EventRule,
    event_spacing,
    learning_rate,
    replan_bound,
    updates_per_epoch,
    warmup_for,
)
from .trainer_speed import TRIAL_BATCHES, TrainerTrial, trainer_trial


logger = logging.getLogger(__name__)


def make_plan(
    settings,
    data,
    model,
    clock: BudgetClock,
    resume: str | None = None,
    restart: Switch | None = None,
    build: Callable[[str], object] | None = None,
) -> Budgeted:
    """The run's plan, from its settings (`training/settings.py`), its prepared data (`training/run_data.py`) and
    the model of its first choice: the one its checkpoint `resume` recorded (or its `budget.json`, for a budgeted
    run killed before its first checkpoint); else measured (where the budget or an open choice asks for it:
    `build(preset)` makes the models of the other sizes to measure; a run that starts again with the choice
    `restart` knows the Trainer's own time of it, used instead of a calibration, and records what it left) and
    computed. Under several processes every process measures (as
    they will train, side by side) and the main process's plan is the one all of them follow; it writes
    `budget.json`."""
    recorded = recorded_plan(settings.output_dir, resume) if resume is not None or settings.budgeted else None
    if recorded is not None and (resume is not None or recorded.max_minutes is not None):
        logger.info("keeping the plan of the run being resumed: %s", recorded.summary())
        complete = recorded.lr_scale is not None and recorded.peak_learning_rate is not None
        first = complete or not recorded.preset or recorded.preset == settings.presets[0] or build is None
        plan = complete_recorded_plan(recorded, settings, model if first else build(recorded.preset))
        if resume is not None:  # the interrupted run spent its budget: the checkpoint's length stands
            return Budgeted(plan)
        # Killed before its first checkpoint: its plan (budget.json), with a deadline and re-plans from this start.
        rules = Planner(settings, data, clock, build).rules_of(plan.max_tokens, plan.max_steps, plan.save_steps)
        return Budgeted(plan, rules)
    planner = Planner(settings, data, clock, build)
    plan = main_process_value(result_or_error(planner.plan, model, restart))
    if isinstance(plan, Exception):  # the main process failed: every process stops with its error
        raise plan
    rules = planner.rules_of(plan.max_tokens, plan.max_steps, plan.save_steps) if plan.max_minutes else None
    if settings.args.should_save:
        write_plan(settings.output_dir, plan)
    return Budgeted(plan, rules)


class Planner:
    """Plans one run: the settled run and its prepared data read once into what the plan needs (its choices, each
    batch size's update and epoch, what it counts with: `rules`), then `plan(model)` measures and fits."""

    def __init__(self, settings, data, clock: BudgetClock, build: Callable[[str], object] | None = None):
        recipe, args = settings.recipe, settings.args
        self.data, self.args, self.clock, self.build, self.rate = data, args, clock, build, settings.rate
        self.optimizer, self.world_size = settings.optimizer, settings.world_size
        self.budgeted, self.max_minutes = settings.budgeted, settings.max_minutes
        self.min_updates, self.max_epochs = recipe.min_updates, recipe.max_epochs
        self.presets = list(settings.presets if build is not None else settings.presets[:1])
        self.sizes = list(settings.token_sizes)
        self.updates = dict(settings.updates)
        self.multiple = pad_multiple(settings.device)
        self.choices, self.device = settings.choices, settings.device
        self.given_length = args.max_steps if args.max_steps > 0 else None
        self.given_epochs = args.num_train_epochs
        validation = data.validation_pairs
        self.rules = BudgetRules(
            events=EventRule(recipe.checkpoints_per_run, recipe.evaluations_per_run, args.save_steps, args.eval_steps),
            validates=settings.validates and validation is not None,
            validation_pairs=validation or 0,
            test_sentences=data.test_pairs + (len(settings.alphas) * validation if validation is not None else 0),
            test_beams=recipe.test_beams,
            validation_beams=args.generation_num_beams or 1,
            source_check=recipe.source_check != "off",
            min_updates=recipe.min_updates,
            max_epochs=recipe.max_epochs,
        )
        self.choosing_alpha = bool(settings.alphas) and validation is not None
        on_gpu = settings.device.type == "cuda"
        self.decode_batch = self.decoding_on_gpu(data, len(settings.alphas), settings.device) if on_gpu else None
        self.where = where(recipe.recipe, settings.device, recipe.model_name_or_path)

    def decoding_on_gpu(self, data, alphas: int, device) -> dict:
        """A GPU's decoding steps in the rules (the test split's with the validation's once per alpha; a validation's
        in the Trainer's batches), and the batch on `device` a step's latency is measured on (`measure_decoding`)."""
        batch, test = median_batch(data.tokenizer, list(data.test["source"]), device)
        validation = [len(ids) for ids in data.evaluation["input_ids"]] if data.evaluation is not None else []
        steps = decoding_steps(test) + alphas * decoding_steps(validation)
        during = validation_decoding_steps(validation, self.args.per_device_eval_batch_size, self.world_size)
        self.rules = replace(self.rules, test_steps=steps, validation_steps=during)
        return batch

    def measure_decoding(self, model, measurement: Measurement) -> tuple[float, float]:
        """On a GPU, a decoding step's latency for `model` in the measured precision and attention, with the test's
        beams and greedy (the validation's); (0, 0) on a CPU (its decoding is predicted from the update's time)."""
        if self.decode_batch is None:
            return 0.0, 0.0
        precision, attention, beams = measurement.precision, measurement.attention, self.rules.test_beams
        step = measure_decode_step(model, self.decode_batch, beams, precision, attention, self.device)
        greedy = (
            step if beams == 1 else measure_decode_step(model, self.decode_batch, 1, precision, attention, self.device)
        )
        return step, greedy

    # --- what a choice costs ---------------------------------------------------------------------------------------

    def epoch_updates(self, max_tokens: int) -> int:
        update = self.updates[max_tokens]
        return updates_per_epoch(self.data.epoch_batches(max_tokens), update.accumulation, update.world_size)

    def first_costs(self, timing: Timing, max_tokens: int, updates: int) -> float:
        """Seconds that `updates` updates of batches of `max_tokens` add to their steady time: the first update of
        every batch shape they meet, and what is paid once."""
        if updates <= 0:
            return 0.0
        batches = updates * self.updates[max_tokens].accumulation
        return timing.once + timing.per_shape * self.data.shapes_met(max_tokens, batches, self.multiple)

    def per_update(self, timing: Timing, max_tokens: int, updates: int) -> float:
        """Seconds per update of a run of `updates` updates, its new shapes paid."""
        return timing.steady + self.first_costs(timing, max_tokens, updates) / max(1, updates)

    def update_timing(self, batch: Timing, max_tokens: int, ratio: float = 1.0) -> Timing:
        """The timing of an update of batches of `max_tokens` from a batch's: its accumulation, and `ratio`, the
        real Trainer's seconds over the calibration's (`trainer_ratio`). On a CPU a ratio measured holds the cost of
        the shapes too (each update pays it: `trainer_speed.py`), so they are not paid apart."""
        shapes = batch.per_shape if ratio == 1.0 or self.device.type != "cpu" else 0.0
        return Timing(batch.steady * self.updates[max_tokens].accumulation * ratio, shapes, batch.once)

    def rank(self, timing: Timing, max_tokens: int) -> float:
        """The calibration's order of candidates: their seconds per update over the updates the budget would give
        them (capped by the epochs), the first update of each new batch shape and what is paid once included."""
        update = self.update_timing(timing, max_tokens)
        updates = max(1, math.floor(self.clock.seconds_left(planned=True) / update.steady))
        if self.max_epochs is not None:
            updates = max(1, min(updates, math.floor(self.max_epochs * self.epoch_updates(max_tokens))))
        return self.per_update(update, max_tokens, updates)

    def rules_of(self, size: int, max_steps: int, save_steps: int) -> BudgetRules:
        """What the re-plans of a plan of `max_steps` updates of batches of `size`, a checkpoint every `save_steps`,
        count with: the rules, with its room to re-plan into, its first check (halfway to the first checkpoint, at
        most after 200 updates) and its batch shapes."""
        multiple = self.multiple
        return replace(
            self.rules,
            max_updates=replan_bound(max_steps, self.epoch_updates(size), self.max_epochs),
            first_check=min(200, max(1, save_steps // 2)),
            accumulation=self.updates[size].accumulation,
            shapes_met=lambda count: self.data.shapes_met(size, count, multiple),
        )

    # --- the plan --------------------------------------------------------------------------------------------------

    def calibration(self, model) -> Calibration:
        """The calibration of `model`'s updates on real training batches of the run."""
        collator = self.data.collator(model.config, self.device)

        def sample(max_tokens: int, count: int, taken: set) -> list[dict]:
            return self.data.collate(self.data.sample_batches(max_tokens, count, taken, self.multiple), collator)

        mode = getattr(self.args, "torch_compile_mode", None)
        return Calibration(self.choices, self.device, sample, self.optimizer, mode)

    def plan(self, model, restart: Switch | None = None) -> BudgetPlan:
        """The plan of the module docstring, `model` of the recipe's first size; `restart` the choice a run starts
        again with (its time known). The choice is made twice: on the calibration's times, then, once the real
        Trainer has run the chosen update on the run's batches (`trainer_ratio`), on every time corrected by the
        ratio it measured (a choice measured later keeps it)."""
        if not self.budgeted:
            return self.given_length_plan(model)
        known = restart.known() if restart is not None else None
        self.measured: dict[str, tuple] = {}  # preset -> (model, measurement, checkpoint seconds, decoding steps)
        chosen = self.choose(model, known, 1.0)
        ratio, said, trial = 1.0, [], None
        if known is None:
            ratio, said, trial = self.trainer_ratio(*chosen)
            chosen = self.choose(model, known, ratio)
        preset, fit = chosen
        first = next(iter(self.measured.values()))[1]
        plan = self.budgeted_plan(preset, fit, ratio, [*first.reasons, *said, self.size_reason(preset, fit)])
        plan = replace(plan, trial=dataclasses.asdict(trial) if trial is not None else None)
        return replace(plan, switched_from=restart.switched_from) if restart is not None else plan

    def choose(self, model, known: Measurement | None, ratio: float) -> tuple[str, BudgetFit]:
        """(size, fit): each model size in turn, largest first, its times times `ratio`; the first whose fit
        reaches `min_updates`, else the last. A size is measured the first time it is met (`measure_size`): a run
        switched to another choice knows its time, the Trainer's, already."""
        for index, preset in enumerate(self.presets):
            last = index == len(self.presets) - 1
            if preset not in self.measured:
                self.measured[preset] = self.measure_size(model if index == 0 else self.build(preset), known)
            sized, measurement, checkpoint, decoding = self.measured[preset]
            if not last and not self.may_reach(measurement, ratio):
                continue  # not even at its smallest batch, with nothing else paid: no need to measure it further
            if decoding is None:  # measured at its smallest batch only: the rest now
                self.measured[preset] = self.measure_size(sized, known, measurement)
                _, measurement, checkpoint, decoding = self.measured[preset]
            self.rules = replace(self.rules, step_seconds=decoding[0], greedy_step_seconds=decoding[1])
            fit = self.fit(measurement.per_size, ratio, checkpoint)
            if fit.enough or last:
                return preset, fit
        raise AssertionError("no preset to choose from")

    def measure_size(self, sized, known: Measurement | None, screened: Measurement | None = None) -> tuple:
        """(model, measurement, checkpoint seconds, decoding step seconds) of one model size. The first size measured
        chooses the precision, attention and compilation at the largest batch (at the smallest, a launch-bound
        update, tf32 beat bf16 on the H100: docs/gpu.md), the others keep them. With several sizes, first at the
        smallest batch (its most updates: one that cannot reach `min_updates` there goes no further, its decoding
        left None), then at the others, with a checkpoint and a decoding step. A restart knows its time."""
        if known is not None:
            return sized, known, self.checkpoint_seconds(sized), self.measure_decoding(sized, known)
        if screened is None:
            calibration = self.calibration(sized)
            choices = self.choices
            if self.measured or len(choices.precisions) * len(choices.attentions) * len(choices.compiles) == 1:
                # the choices of the first size measured, or none open
                fixed = next(iter(self.measured.values()))[1].fixed if self.measured else None
                screened = calibration.measure(sized, self.sizes[-1:], every_size=True, fixed=fixed)
            else:
                screened = calibration.measure(sized, self.sizes[:1], every_size=True, rank=self.rank)
                screened = calibration.extend(sized, screened, self.sizes[-1:])
            if len(self.presets) > 1:
                return sized, screened, 0.0, None
        measurement = self.calibration(sized).extend(sized, screened, self.sizes)
        return sized, measurement, self.checkpoint_seconds(sized), self.measure_decoding(sized, measurement)

    def checkpoint_seconds(self, sized) -> float:
        return measure_checkpoint_seconds(sized) if self.rules.checkpoints else 0.0

    def may_reach(self, measurement: Measurement, ratio: float) -> bool:
        """Whether a size could reach `min_updates` at its smallest batch with no checkpoint and no decoding step
        paid: a bound that spares measuring the other batches of a size too slow for the budget."""
        smallest = self.sizes[-1]
        timing = self.update_timing(measurement.per_size[smallest], smallest, ratio)
        unmeasured = replace(self.rules, step_seconds=0.0, greedy_step_seconds=0.0)
        return self.updates_for_budget(smallest, timing, 0.0, unmeasured).enough

    def trainer_ratio(self, preset: str, fit: BudgetFit) -> tuple[float, list[str], TrainerTrial | None]:
        """(the real Trainer's seconds per update of the chosen size and batch on the run's batches over the
        calibration's, the words that say so, the trial) (`trainer_speed.py`); 1 where the trial cannot run, or
        under several processes: each would time its own choice in a Trainer of collectives it shares with the
        others (the first check re-plans from the Trainer's own updates there)."""
        if self.world_size > 1:
            return 1.0, ["the Trainer's update not measured before training under several processes"], None
        model, measurement, _, _ = self.measured[preset]
        accumulation = self.updates[fit.max_tokens].accumulation
        batches = self.data.sample_batches(fit.max_tokens, TRIAL_BATCHES * accumulation, set(), self.multiple)
        try:
            trial = trainer_trial(model, measurement.fixed, batches, self.data, self.args, accumulation, self.optimizer)
        except (RuntimeError, ValueError) as error:
            return (
                1.0,
                [f"the Trainer's update not measured before training ({str(error).splitlines()[0][:200]})"],
                None,
            )
        ratio = trial.trainer_seconds / fit.timing.steady
        said = (
            f"the Trainer's own update {trial.trainer_seconds:.3f} s on {len(batches)} of the run's batches ("
            f"{ratio:.2f} of the calibration's {fit.timing.steady:.3f} s; its own work "
            f"{trial.overhead * 1000:.1f} ms an update)"
        )
        return ratio, [said], trial

    def candidate(self, preset: str, max_tokens: int, batch: Timing, ratio: float) -> dict:
        """A calibrated choice: its preset, batch size, accumulation, the Trainer's seconds per update and the
        updates per epoch."""
        return {
            "preset": preset,
            "max_tokens": max_tokens,
            "accumulation": self.updates[max_tokens].accumulation,
            "seconds_per_update": self.update_timing(batch, max_tokens, ratio).steady,
            "updates_per_epoch": self.epoch_updates(max_tokens),
        }

    def fit(self, per_size: dict[int, Timing], ratio: float, checkpoint_seconds: float) -> BudgetFit:
        """The largest batch size that still gives `min_updates` updates in the budget (enough), else the smallest,
        from the measured seconds of a batch at each size (times `ratio`, the Trainer's over the calibration's) and
        of a checkpoint."""
        for max_tokens in self.sizes:
            fit = self.updates_for_budget(
                max_tokens, self.update_timing(per_size[max_tokens], max_tokens, ratio), checkpoint_seconds
            )
            if fit.enough:
                break
        if len(self.sizes) > 1:
            listed = ", ".join(map(str, self.sizes))
            fit.reason += f"; batches of {fit.max_tokens:,} tokens per side (of {listed}: " + (
                f"the largest that gives {self.min_updates:,} updates)"
                if fit.enough
                else f"none gives {self.min_updates or 0:,} updates here)"
            )
        return fit

    def updates_for_budget(
        self, max_tokens: int, timing: Timing, checkpoint_seconds: float, rules: BudgetRules | None = None
    ) -> BudgetFit:
        """The updates that fit the budget at `timing` (an update's, measured) once set-up so far, the checkpoints,
        the validations, the test decoding and the first update of each new batch shape are paid for (as `rules`
        count them, default the run's)."""
        rules, update = rules or self.rules, timing.steady
        tokens = max_tokens * self.updates[max_tokens].accumulation
        decode, validation = rules.test_decode_seconds(update, tokens), rules.validation_seconds(update, tokens)
        left = self.clock.seconds_left(decode, planned=True)
        first_costs = lambda updates: self.first_costs(timing, max_tokens, updates)  # noqa: E731
        fit = updates_that_fit(
            left, update, rules.checkpoints, checkpoint_seconds, rules.validations, validation, first_costs
        )
        reason = (
            f"{fit:,} updates fit {left / 60:.1f} training minutes of the {self.max_minutes:g}-minute budget "
            f"({update:.2f} s each; set-up so far {self.clock.spent() / 60:.1f} min, test decoding "
            f"{decode / 60:.1f} min predicted{', with the choice of alpha' if self.choosing_alpha else ''})"
        )
        per_epoch = self.epoch_updates(max_tokens)
        if self.max_epochs is not None and fit > self.max_epochs * per_epoch:
            fit = max(1, math.floor(self.max_epochs * per_epoch))
            reason += f"; capped at {fit:,} = {self.max_epochs:g} epochs of this corpus"
        training = fit * update + first_costs(fit) + rules.checkpoints * checkpoint_seconds
        training += rules.validations * validation
        enough = self.min_updates is None or fit >= self.min_updates
        return BudgetFit(max_tokens, fit, timing, training, decode, reason, enough, checkpoint_seconds, validation)

    def size_reason(self, preset: str, fit: BudgetFit) -> str:
        """The fit in words, with the model size chosen where there was a choice."""
        if fit.max_steps < 1:
            raise BudgetError(
                f"max_minutes={self.max_minutes:g} leaves no time to train on this machine (set-up took "
                f"{self.clock.spent() / 60:.1f} min, an update {fit.timing.steady:.2f} s); give more minutes."
            )
        if len(self.presets) == 1:
            return fit.reason
        rule = "the largest that gives" if fit.enough else "none gives"
        return f"the {preset} model ({', '.join(self.presets)}: {rule} {self.min_updates or 0:,} updates); {fit.reason}"

    def budgeted_plan(self, preset: str, fit: BudgetFit, ratio: float, reasons: list[str]) -> BudgetPlan:
        """The budgeted plan of `fit` for `preset`: its schedule, what it predicted (see `BudgetPlan`), every choice
        measured with its time (the Trainer's: times `ratio`)."""
        model, measurement, _, _ = self.measured[preset]
        measured, candidates = {}, []
        for name, (_, each, _, _) in self.measured.items():
            prefix = f"{name}/" if len(self.presets) > 1 else ""
            measured.update({prefix + key: seconds for key, seconds in each.measured.items()})
            candidates += [self.candidate(name, size, each.per_size[size], ratio) for size in each.per_size]
        plan = self.schedule(model, fit.max_steps, fit.max_tokens, measurement, reasons, measured)
        return replace(
            plan,
            preset=preset,
            max_minutes=self.max_minutes,
            seconds_per_update=fit.timing.steady,
            calibrated_seconds_per_update=fit.timing.steady / ratio,
            trainer_ratio=ratio,
            seconds_per_new_shape=fit.timing.per_shape,
            once_seconds=fit.timing.once,
            predicted_seconds_per_update=self.per_update(fit.timing, fit.max_tokens, fit.max_steps),
            planned_training_seconds=fit.training_seconds,
            predicted_decode_seconds=fit.decode_seconds,
            checkpoint_seconds=fit.checkpoint_seconds,
            validation_seconds=fit.validation_seconds,
            candidates=candidates,
        )

    def given_length_plan(self, model) -> BudgetPlan:
        """The plan of a run whose length is given (`--max_steps`, or epochs): the precision, attention and
        compilation measured only where the recipe leaves them open, ranked by the time of the whole run."""
        max_tokens = self.sizes[0]
        max_steps = self.given_length or math.ceil(self.given_epochs * self.epoch_updates(max_tokens))

        def rank(timing: Timing, size: int) -> float:
            return self.per_update(self.update_timing(timing, size), size, max_steps)

        measurement = self.calibration(model).measure(model, [max_tokens], every_size=False, rank=rank)
        reasons = [*measurement.reasons, f"{max_steps:,} updates as given"]
        plan = self.schedule(model, max_steps, max_tokens, measurement, reasons, measurement.measured)
        timing = measurement.per_size.get(max_tokens)
        if timing is None:
            return plan
        update = self.update_timing(timing, max_tokens)
        return replace(
            plan,
            seconds_per_update=update.steady,
            calibrated_seconds_per_update=update.steady,
            seconds_per_new_shape=update.per_shape,
            once_seconds=update.once,
            predicted_seconds_per_update=self.per_update(update, max_tokens, max_steps),
        )

    def schedule(self, model, max_steps, max_tokens, measurement: Measurement, reasons, measured) -> BudgetPlan:
        """The plan of a run of `max_steps` updates: the schedule follows from the length (warmup, checkpoint and
        validation spacing), the learning rate from the warmup, the update's tokens and the model's width."""
        warmup = warmup_for(max_steps, self.rate.warmup, self.rate.max_warmup_fraction)
        save, evaluate = event_spacing(max_steps, self.rules.events)
        update = self.updates[max_tokens]
        rate = learning_rate(self.rate, model.config.d_model, warmup, update.tokens)
        cadence = f"warmup {warmup:,} updates to a peak learning rate of {rate.peak:.2e}, a checkpoint every {save:,}"
        if self.rules.validates and evaluate:
            cadence += f", validation every {evaluate:,}"
        return BudgetPlan(
            max_steps=max_steps,
            warmup_steps=warmup,
            save_steps=save,
            eval_steps=evaluate,
            precision=measurement.precision,
            attn_implementation=measurement.attention,
            torch_compile=measurement.compiled,
            max_tokens=max_tokens,
            measured=measured,
            reasons=[self.where, *reasons, cadence],
            gradient_accumulation_steps=update.accumulation,
            lr_scale=rate.lr_scale,
            peak_learning_rate=rate.peak,
        )


def where(recipe: str | None, device, start: str | None = None) -> str:
    """Where the run trains, its recipe and the saved model it continues (`start`): the plan line's first part."""
    place = describe_device(device)
    said = f"recipe {recipe} on {place}" if recipe else f"on {place}"
    return said + (f"; fine-tuning {Path(start).name}" if start else "")
