"""Making a run's plan: `make_plan`, and its steps as functions that return values: measure (`measuring.py`) ->
choose (here) -> fit (`fitting.py`) -> schedule (here).

A budgeted run measures each model size of the recipe in turn (largest first): its precision, attention,
compilation (chosen by `measuring.py` from the calibration's times) and the time of a batch at each batch size
(`calibration.py`), the Trainer's own work beyond that update (`trainer_speed.py`, once), and the number of updates
that fits the time left at each batch size once the checkpoints, validations, the test decoding and the first update
of each new batch shape are paid for; it keeps the first size whose fit reaches `min_updates` (else the last), and
the largest batch size that does. A run of a given length measures only what the recipe leaves open. The schedule
follows from the length (`schedule.py`).
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import math
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from ...utils.device import pad_multiple
from ...utils.distributed import main_process_value, result_or_error
from ...utils.machine import describe_device
from .calibration import Measurement, Timing
from .clock import BudgetClock, BudgetError
from .costs import BudgetFit, BudgetRules, HeldOut
from .fitting import PlanInputs, epoch_updates, fit, may_reach, per_update, rank, replan_rules, update_timing
from .measuring import Sized, calibration_of, decoding_on_gpu, measure_size, measure_update
from .plan import Budgeted, BudgetPlan
from .record import complete_recorded_plan, recorded_plan, write_plan
from .replanning import Switch
from .schedule import EventRule, dropout_for, event_spacing, learning_rate, reached_step, warmup_for
from .trainer_speed import trainer_ratio


logger = logging.getLogger(__name__)


def make_plan(
    settings,
    data,
    model,
    clock: BudgetClock,
    resume: str | None = None,
    restart: Switch | None = None,
    build: Callable[[str], object] | None = None,
    trainer_class: type | None = None,
) -> Budgeted:
    """The run's plan, from its settings (`training/settings.py`), its prepared data (`training/run_data.py`) and
    the model of its first choice: the one its checkpoint `resume` recorded (or its `budget.json`, for a budgeted
    run killed before its first checkpoint); else measured (where the budget or an open choice asks for it:
    `build(preset)` makes the models of the other sizes to measure; a run that starts again with the choice
    `restart` knows the Trainer's own time of it, used instead of a calibration, and records what it left) and
    computed; `trainer_class`, the run's Trainer, runs the trial of the Trainer's own work (`trainer_speed.py`).
    Under several processes every process measures (as they will train, side by side) and the main process's plan
    is the one all of them follow; it writes `budget.json` and says the plan ("Plan: ...")."""
    recorded = recorded_plan(settings.output_dir, resume) if resume is not None or settings.budgeted else None
    if recorded is not None and (resume is not None or recorded.record.max_minutes is not None):
        budgeted = kept_plan(recorded, settings, data, model, clock, resumed=resume is not None, build=build)
    else:
        inputs = plan_inputs(settings, data, clock, build, trainer_class)
        plan = main_process_value(result_or_error(plan_run, inputs, model, restart))
        if isinstance(plan, Exception):  # the main process failed: every process stops with its error
            raise plan
        budgeted = Budgeted(plan, replan_rules(inputs, plan) if plan.record.max_minutes else None)
        if settings.args.should_save:
            write_plan(settings.output_dir, plan)
    if settings.args.should_save:
        print(f"Plan{', started again' if restart else ''}: {budgeted.plan.summary()}.", flush=True)
    return budgeted


def kept_plan(recorded: BudgetPlan, settings, data, model, clock, resumed: bool, build=None) -> Budgeted:
    """The plan an interrupted run recorded, completed where it was recorded before it held its batch and rate
    (`complete_recorded_plan`): a resumed run's as it stands (it spent its budget); one killed before its first
    checkpoint (its budget.json) with a deadline and re-plans from this start."""
    logger.info("keeping the plan of the run being resumed: %s", recorded.summary())
    choice, schedule = recorded.choice, recorded.schedule
    complete = schedule.lr_scale is not None and schedule.peak_learning_rate is not None
    first = complete or not choice.preset or choice.preset == settings.presets[0] or build is None
    plan = complete_recorded_plan(recorded, settings, model if first else build(choice.preset))
    if resumed:
        return Budgeted(plan)
    return Budgeted(plan, replan_rules(plan_inputs(settings, data, clock, build), plan))


def plan_inputs(settings, data, clock: BudgetClock, build=None, trainer_class=None) -> PlanInputs:
    """What the plan's steps read (`PlanInputs`), the settled run and its data read once; on a GPU with the decoding
    steps it will take and the batch a step's latency is measured on."""
    rules = run_rules(settings, data)
    if settings.device.type == "cuda":
        eval_batch, searches = settings.args.per_device_eval_batch_size, alpha_searches(len(settings.alphas))
        rules = decoding_on_gpu(rules, data, searches, settings.device, eval_batch, settings.world_size)
    presets = tuple(settings.presets if build is not None else settings.presets[:1])
    return PlanInputs(settings, data, clock, rules, presets, pad_multiple(settings.device), build, trainer_class)


def alpha_searches(alphas: int) -> int:
    """The decodings of the validation pairs that the choice among `alphas` GNMT alphas takes: one for all of them
    (`evaluation.translation.translate_each_alpha`: with early stopping, the model's default, alpha only ranks what
    a beam search finished), none without a choice. It decoded them once per alpha before: with the recipes' three
    alphas and 500 validation pairs, 1,500 sentences of beam search beside the help's 1,152 test sentences."""
    return 1 if alphas else 0


def run_rules(settings, data) -> BudgetRules:
    """What a run counts with beside an update's time (`BudgetRules`), from its settings and its held-out splits:
    its events, whether it validates, the held-out work, `min_updates` and the epoch cap."""
    recipe, args = settings.recipe, settings.args
    validation = len(data.evaluation) if data.evaluation is not None else None
    held_out = HeldOut(
        validation_pairs=validation or 0,
        test_sentences=len(data.test) + (alpha_searches(len(settings.alphas)) * validation if validation else 0),
        test_beams=recipe.test_beams,
        validation_beams=args.generation_num_beams or 1,
        source_check=recipe.source_check != "off",
    )
    return BudgetRules(
        events=EventRule(recipe.checkpoints_per_run, recipe.evaluations_per_run, args.save_steps, args.eval_steps),
        validates=settings.validates and validation is not None,
        held_out=held_out,
        min_updates=recipe.min_updates,
        max_epochs=recipe.max_epochs,
        size_min_updates=settings.size_min_updates,
    )


def plan_run(inputs: PlanInputs, model, restart: Switch | None = None) -> BudgetPlan:
    """The plan of the module docstring, `model` of the recipe's first size; `restart` the choice a run starts again
    with (its time known). The choice is made twice: on the calibration's times, then, once the real Trainer has run
    the chosen update on the run's batches (`trainer_ratio`), on every time corrected by the ratio it measured (a
    choice measured later keeps it)."""
    if not inputs.settings.budgeted:
        return given_length_plan(inputs, model)
    known = restart.known() if restart is not None else None
    preset, chosen, measured = choose(inputs, model, known, 1.0, {})
    ratio, said, trial = 1.0, [], None
    if known is None:
        ratio, said, trial = trainer_ratio(inputs, measured[preset], chosen)
        preset, chosen, measured = choose(inputs, model, known, ratio, measured)
    first = next(iter(measured.values())).measurement
    reasons = [*first.reasons, *said, size_reason(inputs, preset, chosen)]
    plan = budgeted_plan(inputs, preset, chosen, ratio, reasons, measured)
    plan = plan.but(trial=dataclasses.asdict(trial) if trial is not None else None)
    return plan.but(switched_from=restart.switched_from) if restart is not None else plan


def choose(
    inputs: PlanInputs, model, known: Measurement | None, ratio: float, measured: dict[str, Sized]
) -> tuple[str, BudgetFit, dict[str, Sized]]:
    """(size, fit, every size measured so far): each model size in turn, largest first, its times times `ratio`; the
    first whose fit reaches its updates (`BudgetRules.least_updates`), else the last. A size is measured the first
    time it is met (`measure_size`; `measured` holds those met before): a run switched to another choice knows its
    time, the Trainer's, already. A size that needs more updates than `min_updates` (`size_min_updates`: the larger
    sizes of a long budget) is measured only where the first size that does not (the anchor, measured first) reaches
    them: a larger model's update is never faster, so one the anchor's time rules out costs no measuring."""
    measured, presets = dict(measured), inputs.presets
    grown = {name for name, _ in inputs.rules.size_min_updates}
    anchor = next((name for name in presets if name not in grown), presets[-1])
    for index, preset in enumerate(presets):
        last = index == len(presets) - 1
        own = inputs.rules.for_size(preset) if len(presets) > 1 else inputs.rules  # the updates this size must reach
        if preset in grown and preset != anchor:
            _measure(inputs, model, known, measured, anchor)
            if not may_reach(inputs, measured[anchor].measurement.per_size, ratio, own):
                continue  # the anchor's update, never slower, does not reach this size's updates
        sized = _measure(inputs, model, known, measured, preset)
        if not last and not may_reach(inputs, sized.measurement.per_size, ratio, own):
            continue  # not even at its smallest batch, with nothing else paid: no need to measure it further
        if sized.decoding is None:  # measured at its smallest batch only: the rest now
            sized = measured[preset] = measure_size(inputs, sized.model, known, None, sized.measurement)
        step, greedy = sized.decoding
        rules = replace(own, steps=replace(own.steps, step_seconds=step, greedy_step_seconds=greedy))
        chosen = fit(inputs, sized.measurement.per_size, ratio, sized.checkpoint_seconds, rules)
        if chosen.enough or last:
            return preset, chosen, measured
    raise AssertionError("no preset to choose from")


def _measure(inputs: PlanInputs, model, known: Measurement | None, measured: dict[str, Sized], preset: str) -> Sized:
    """Size `preset` as measured, measured now (into `measured`) where it was not yet: the first size measured
    chooses the precision, attention and compilation, the others keep them; `model` is the first size's."""
    if preset not in measured:
        fixed = next(iter(measured.values())).measurement.fixed if measured else None
        sized = model if preset == inputs.presets[0] else inputs.build(preset)
        measured[preset] = measure_size(inputs, sized, known, fixed)
    return measured[preset]


def size_reason(inputs: PlanInputs, preset: str, chosen: BudgetFit) -> str:
    """The fit in words, with the model size chosen where there was a choice."""
    if chosen.max_steps < 1:
        raise BudgetError(
            f"max_minutes={inputs.settings.max_minutes:g} leaves no time to train on this machine (set-up took "
            f"{inputs.clock.spent() / 60:.1f} min, an update {chosen.timing.steady:.2f} s); give more minutes."
        )
    presets = inputs.presets
    if len(presets) == 1:
        return chosen.reason
    rules, others = inputs.rules, presets[:-1]
    if len({rules.least_updates(name) for name in others}) > 1:  # sizes of their own minimums
        least = ", ".join(f"{name} {rules.least_updates(name) or 0:,}" for name in others)
        rule = f"{'the largest that reaches' if chosen.enough else 'none reaches'} its updates: {least}"
    else:
        rule = f"{'the largest that gives' if chosen.enough else 'none gives'} {rules.min_updates or 0:,} updates"
    return f"the {preset} model ({', '.join(presets)}: {rule}); {chosen.reason}"


def budgeted_plan(
    inputs: PlanInputs, preset: str, chosen: BudgetFit, ratio: float, reasons: list[str], measured: dict[str, Sized]
) -> BudgetPlan:
    """The budgeted plan of `chosen` for `preset`: its schedule, what it predicted (see `BudgetPlan`), every choice
    measured with its time (the Trainer's: times `ratio`)."""
    times, several = {}, len(inputs.presets) > 1
    for name, sized in measured.items():
        each = sized.measurement
        times.update({(f"{name}/" if several else "") + key: seconds for key, seconds in each.measured.items()})
    sized, timing, steps = measured[preset], chosen.timing, chosen.max_steps
    plan = schedule(inputs, sized.model, steps, chosen.max_tokens, sized.measurement, reasons, times)
    if several:
        sized_rule = {"rule": "preset_choices", "said": f"size {preset}"}
        plan = plan.but(rules=[sized_rule, *plan.record.rules])
    # After the schedule, what the fit says of every choice measured and of the chosen run, and then in make_plan
    # the re-plans' rules: fitting.py is asked once for all three (tests/test_run_order.py counts the returns).
    candidates = [  # in the recipe's order of preference (a switch takes the first that fits), not as measured
        candidate(inputs, name, size, timed, ratio)
        for name in inputs.presets
        if name in measured
        for size, timed in measured[name].measurement.per_size.items()
    ]
    predicted = per_update(inputs, timing, chosen.max_tokens, steps)
    return plan.but(
        preset=preset,
        max_minutes=inputs.settings.max_minutes,
        seconds_per_update=timing.steady,
        calibrated_seconds_per_update=timing.steady / ratio,
        trainer_ratio=ratio,
        seconds_per_new_shape=timing.per_shape,
        once_seconds=timing.once,
        predicted_seconds_per_update=predicted,
        planned_training_seconds=chosen.seconds.training,
        predicted_decode_seconds=chosen.seconds.decode,
        checkpoint_seconds=chosen.seconds.checkpoint,
        validation_seconds=chosen.seconds.validation,
        decode_step_seconds=sized.decoding[0],
        greedy_step_seconds=sized.decoding[1],
        candidates=candidates,
    )


def candidate(inputs: PlanInputs, preset: str, max_tokens: int, batch: Timing, ratio: float) -> dict:
    """A calibrated choice: its preset, batch size, accumulation, the Trainer's seconds per update and the updates
    per epoch."""
    return {
        "preset": preset,
        "max_tokens": max_tokens,
        "accumulation": inputs.settings.updates[max_tokens].accumulation,
        "seconds_per_update": update_timing(inputs, batch, max_tokens, ratio).steady,
        "updates_per_epoch": epoch_updates(inputs, max_tokens),
    }


def given_length_plan(inputs: PlanInputs, model) -> BudgetPlan:
    """The plan of a run whose length is given (`--max_steps`, or epochs): the precision, attention and compilation
    measured only where the recipe leaves them open, ranked by the time of the whole run."""
    args, max_tokens = inputs.settings.args, inputs.settings.token_sizes[0]
    max_steps = args.max_steps if args.max_steps > 0 else None
    max_steps = max_steps or math.ceil(args.num_train_epochs * epoch_updates(inputs, max_tokens))

    whole_run = functools.partial(rank, inputs, updates=max_steps)
    measurement = measure_update(calibration_of(inputs, model), model, [max_tokens], every_size=False, order=whole_run)
    reasons = [*measurement.reasons, f"{max_steps:,} updates as given"]
    plan = schedule(inputs, model, max_steps, max_tokens, measurement, reasons, measurement.measured)
    timing = measurement.per_size.get(max_tokens)
    if timing is None:
        return plan
    update = update_timing(inputs, timing, max_tokens)
    return plan.but(
        seconds_per_update=update.steady,
        calibrated_seconds_per_update=update.steady,
        seconds_per_new_shape=update.per_shape,
        once_seconds=update.once,
        predicted_seconds_per_update=per_update(inputs, update, max_tokens, max_steps),
    )


def schedule(
    inputs: PlanInputs, model, max_steps: int, max_tokens: int, measurement: Measurement, reasons, measured
) -> BudgetPlan:
    """The plan of a run of `max_steps` updates: the schedule follows from the length (warmup, checkpoint and
    validation spacing), the learning rate from the warmup, the update's tokens and the model's width."""
    settings, rules = inputs.settings, inputs.rules
    place = where(settings.recipe.recipe, settings.device, settings.recipe.model_name_or_path)
    warmup = warmup_for(max_steps, settings.rate.warmup, settings.rate.max_warmup_fraction)
    save, evaluate = event_spacing(max_steps, rules.events)
    update = settings.updates[max_tokens]
    rate = learning_rate(settings.rate, model.config.d_model, warmup, update.tokens)
    epochs = max_steps / epoch_updates(inputs, max_tokens)
    dropout, fired = dropout_for(settings.dropout_steps, epochs), list(settings.fired)
    cadence = f"warmup {warmup:,} updates to a peak learning rate of {rate.peak:.2e}, a checkpoint every {save:,}"
    if rules.validates and evaluate:
        cadence += f", validation every {evaluate:,}"
    cadence += "".join(f" ({rule['said']}: {rule['rule']})" for rule in settings.fired)
    uncut = warmup_for(max_steps, settings.rate.warmup)
    if warmup < uncut:  # said after the rule that set the warmup (a fine-tuning start's), which it cuts
        cadence += f" (warmup cut from {uncut:,} to {warmup:,}: max_warmup_fraction)"
        fired.append({"rule": "max_warmup_fraction", "said": f"warmup cut to {warmup:,}"})
    if dropout is not None:
        cadence += f"; dropout {dropout:g} for {epochs:.1f} epochs of the corpus"
        fired.append({"rule": "dropout_by_epochs", "said": f"dropout {dropout:g} ({epochs:.1f} epochs predicted)"})
    last = reached_step(settings.averaging_steps, epochs)  # the count the end averages at these epochs
    if last is not None:  # the end decides again on the epochs made (finishing.averaging_of_run)
        cadence += f"; the last {last} checkpoints averaged for {epochs:.1f} epochs"
        said = f"the last {last} checkpoints averaged ({epochs:.1f} epochs predicted)"
        fired.append({"rule": "average_last_by_epochs", "said": said})
    return BudgetPlan.of(
        dropout=dropout,
        average_last=last,
        rules=fired,
        max_steps=max_steps,
        warmup_steps=warmup,
        save_steps=save,
        eval_steps=evaluate,
        precision=measurement.precision,
        attn_implementation=measurement.attention,
        torch_compile=measurement.compiled,
        max_tokens=max_tokens,
        measured=measured,
        reasons=[place, *reasons, cadence],
        gradient_accumulation_steps=update.accumulation,
        lr_scale=rate.lr_scale,
        peak_learning_rate=rate.peak,
    )


def where(recipe: str | None, device, start: str | None = None) -> str:
    """Where the run trains, its recipe and the saved model it continues (`start`): the plan line's first part."""
    place = describe_device(device)
    said = f"recipe {recipe} on {place}" if recipe else f"on {place}"
    return said + (f"; fine-tuning {Path(start).name}" if start else "")
