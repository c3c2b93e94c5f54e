"""The calibration's measurement (training/budget/calibration.py) as a GPU needs it, proven on the CPU through its own code:
every clock read waits for the device, every timed shape has been run before its steady update, a new shape's cost
and what is paid once are told apart, the model is left where it was; the measuring step stages the choices and
ranks the times the calibration hands back as the budget ranks them (training/budget/measuring.py); and the budget's
arithmetic pays for the shapes a run meets."""

from __future__ import annotations

import functools
import math
import types

import pytest
import torch

from hf_vanilla_transformer.training.arguments import ModelDataArguments, TransformerTrainingArguments
from hf_vanilla_transformer.training.budget import calibration
from hf_vanilla_transformer.training.budget.calibration import (
    Calibration,
    Timing,
    UpdateChoices,
    measure_updates,
    trainer_optimizer,
)
from hf_vanilla_transformer.training.budget.clock import FINISHING_SECONDS, SAFETY, BudgetClock
from hf_vanilla_transformer.training.budget.costs import BudgetRules, ReplanRoom, updates_that_fit
from hf_vanilla_transformer.training.budget.deadline import TimeBudgetCallback
from hf_vanilla_transformer.training.budget.fitting import PlanInputs, rank
from hf_vanilla_transformer.training.budget.measuring import measure_update
from hf_vanilla_transformer.training.budget.replanning import refit
from hf_vanilla_transformer.training.budget.schedule import EventRule
from hf_vanilla_transformer.training.settings import compile_choices, update_choices

from conftest import plan_of, random_ids, tiny_model


def shaped_batches() -> list[dict]:
    """Three training batches of different shapes (pairs x source x target)."""
    return [
        {"input_ids": random_ids(rows, source, seed=rows), "labels": random_ids(rows, target, seed=rows + 1)}
        for rows, source, target in ((2, 5, 4), (3, 7, 6), (4, 3, 9))
    ]


def calibration_of(choices: UpdateChoices, sample=None) -> Calibration:
    """The calibration of `choices` on the CPU, on `shaped_batches` (or `sample(size, count, taken)`)."""
    sample = sample or (lambda size, count, taken: shaped_batches())
    return Calibration(choices, torch.device("cpu"), sample, trainer_optimizer(None))


def cpu_choices(**recipe) -> UpdateChoices:
    """What a recipe of these fields leaves open on the CPU."""
    args = TransformerTrainingArguments(output_dir="unused", use_cpu=True)
    return update_choices(ModelDataArguments(**recipe), args, torch.device("cpu"))


def test_every_clock_read_waits_for_the_device_and_every_timed_shape_ran_before(monkeypatch):
    """The events of a measurement, in order: a clock is read only right after the device was synchronised, each
    candidate first runs on a shape no sample has, and each sample is timed as a new shape, then again after the
    others of its round (cold, then warm: not right after its first update, as the Trainer meets a shape again)."""
    events: list = []
    model = tiny_model().train()
    model.register_forward_pre_hook(
        lambda module, args, kwargs: events.append(("run", kwargs["input_ids"].shape)), with_kwargs=True
    )
    ticks = iter(range(1000))

    def clock() -> float:
        events.append("clock")
        return float(next(ticks))

    batches = shaped_batches()
    measured = measure_updates(
        model, batches, [("fp32", "eager", False)], clock=clock, synchronize=lambda: events.append("sync")
    )
    assert all(events[i - 1] == "sync" for i, event in enumerate(events) if event == "clock")
    runs = [event[1] for event in events if event != "clock" and event != "sync"]
    sampled = [tuple(batch["input_ids"].shape) for batch in batches]
    assert tuple(runs[0]) not in sampled  # the warm-up shape
    first, second, third = sampled  # two rounds: the first two batches, then the third
    assert [tuple(shape) for shape in runs[1:]] == [first, second, second, first, third, third]
    # Two clock reads around each timed update, none around the warm-up.
    assert events.count("clock") == 2 * 2 * len(batches)
    assert measured["fp32/eager"] == Timing(steady=1.0, per_shape=0.0, once=0.0)  # every update took one tick


def test_a_new_shapes_cost_and_what_is_paid_once_are_told_apart(monkeypatch):
    """First updates of 5.0, 0.3, 0.3, 0.3 s against steady ones of 0.1 s: a new shape costs 0.2 s more (the median
    of the differences), and the first 4.7 s more once (a compilation's first graph)."""
    # Two rounds of two batches: the cold updates of a round, then its warm ones in reverse order.
    durations = iter([5.0, 0.3, 0.1, 0.1, 0.3, 0.3, 0.1, 0.1])
    now = [0.0]

    def clock() -> float:
        return now[0]

    class Copy(calibration._Copy):
        def update(self, batch):
            if batch["input_ids"].shape[0] > 1:  # not the warm-up batch of one pair
                now[0] += next(durations)

    monkeypatch.setattr(calibration, "_Copy", Copy)
    batches = [*shaped_batches(), shaped_batches()[0]]
    measured = measure_updates(tiny_model(), batches, [("fp32", "eager", False)], clock=clock)
    timing = measured["fp32/eager"]
    assert timing.steady == pytest.approx(0.1)
    assert timing.per_shape == pytest.approx(0.2)
    assert timing.once == pytest.approx(4.7)


def test_the_measurement_leaves_the_model_where_it_was():
    model = tiny_model(seed=0)
    model.set_attn_implementation("eager")
    parameters = {name: (p.data_ptr(), p.device, p.dtype) for name, p in model.named_parameters()}
    before = {k: v.clone() for k, v in model.state_dict().items()}
    was_training = model.training
    choices = cpu_choices(precision="fp32", attn_implementation="auto")
    measurement = measure_update(calibration_of(choices), model, [512], every_size=True)
    assert measurement.precision == "fp32" and measurement.attention in ("eager", "sdpa")
    assert {name: (p.data_ptr(), p.device, p.dtype) for name, p in model.named_parameters()} == parameters
    assert all(torch.equal(value, before[key]) for key, value in model.state_dict().items())
    assert model.training == was_training and model.config._attn_implementation == "eager"


def scripted(timings: dict[str, Timing], log: list):
    """A `measure_updates` that returns the given timings and records which candidates it was asked for."""

    def measure(model, batches, candidates, *args, **kwargs):
        log.append([calibration.candidate_key(*c) for c in candidates])
        return {calibration.candidate_key(*c): timings[calibration.candidate_key(*c)] for c in candidates}

    return measure


def test_many_choices_are_measured_in_stages_and_ranked_by_what_the_run_pays(monkeypatch):
    """Four precisions and three attentions (a GPU's): the precisions with sdpa first, then the attentions with the
    best precision: 6 measured, not 12. sdpa in fp16 is the fastest steady update but pays 0.5 s for each new shape;
    over a run that meets a new shape every 100 updates, bf16 with sdpa is cheaper, and is chosen."""
    timings = {
        "bf16/sdpa": Timing(0.010),
        "fp16/sdpa": Timing(0.008, per_shape=0.5),
        "tf32/sdpa": Timing(0.020),
        "fp32/sdpa": Timing(0.040),
        "bf16/eager": Timing(0.014),
        "bf16/flex_attention": Timing(0.012, once=30.0),
    }
    log: list = []
    monkeypatch.setattr(calibration, "measure_updates", scripted(timings, log))
    choices = UpdateChoices(("bf16", "fp16", "tf32", "fp32"), ("eager", "sdpa", "flex_attention"), (False,), True)

    def rank(timing: Timing, size: int) -> float:  # 10,000 updates meeting 100 shapes
        return timing.steady + (timing.per_shape * 100 + timing.once) / 10_000

    handed: list = []

    def sample(size: int, count: int, taken: set) -> list[dict]:
        handed.append(count)
        return shaped_batches()

    measurement = measure_update(calibration_of(choices, sample), tiny_model(), [4096], every_size=True, order=rank)
    assert log == [
        ["bf16/sdpa", "fp16/sdpa", "tf32/sdpa", "fp32/sdpa"],
        ["bf16/eager", "bf16/flex_attention"],
    ]
    assert handed == [4 * calibration.SAMPLE_BATCHES, 2 * calibration.SAMPLE_BATCHES]  # shapes of their own
    assert (measurement.precision, measurement.attention, measurement.compiled) == ("bf16", "sdpa", False)
    assert measurement.reasons[0].startswith(
        "bf16: 10.0 ms per update against 8.0 ms (+0.50 s a new batch shape) in fp16"
    )
    assert "flex_attention" in measurement.reasons[1] and "(+30 s once)" in measurement.reasons[1]
    assert set(measurement.measured) == {f"{key}@4096" for key in timings}


def test_a_compiled_step_is_measured_only_where_a_long_run_on_cuda_may_pay_for_it():
    args = TransformerTrainingArguments(output_dir="unused", use_cpu=True)
    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    short = ModelDataArguments(max_minutes=26)
    long = ModelDataArguments(max_minutes=120)
    assert compile_choices(short, args, cuda) == [False]
    assert compile_choices(long, args, cuda) == [False, True]
    assert compile_choices(long, args, cpu) == [False]  # measured slower on CPUs (docs/speed.md)
    assert compile_choices(ModelDataArguments(max_minutes=26, compile_training="always"), args, cpu) == [True]
    assert compile_choices(ModelDataArguments(compile_training="never"), args, cuda) == [False]


def test_the_updates_that_fit_pay_for_the_new_shapes_they_meet():
    # 100 s at 0.1 s an update: 1,000 updates; each update meeting a new shape at 0.1 s more halves them, and a
    # one-time 50 s leaves 250.
    assert updates_that_fit(100.0, 0.1) == 1000
    assert updates_that_fit(100.0, 0.1, first_costs=lambda n: 0.1 * n) == 500
    assert updates_that_fit(100.0, 0.1, first_costs=lambda n: 50.0 + 0.1 * n if n else 0.0) == 250
    # 20 shapes in all, 1 s each: paid once the run has met them all.
    assert updates_that_fit(100.0, 0.1, first_costs=lambda n: float(min(n, 20))) == 800


def test_a_candidate_that_cannot_run_is_left_out_with_its_reason(monkeypatch):
    """Out of memory on one candidate (fp32 big at 25k tokens on a small GPU, say): the others are measured and the
    plan says why it was left out; where none runs, the error names every failure."""

    class Copy(calibration._Copy):
        def update(self, batch):
            if self.key == "fp32/sdpa":
                raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB\nmore detail")
            super().update(batch)

    monkeypatch.setattr(calibration, "_Copy", Copy)
    measure = functools.partial(
        measure_update, calibration_of(cpu_choices(precision="fp32", attn_implementation="auto"))
    )
    measurement = measure(tiny_model(), [512], every_size=True)
    assert measurement.attention == "eager"
    assert measurement.reasons[0] == "fp32/sdpa left out: out of memory"
    assert set(measurement.measured) == {"fp32/eager@512"}
    monkeypatch.setattr(Copy, "update", lambda self, batch: (_ for _ in ()).throw(RuntimeError("no kernel")))
    with pytest.raises(ValueError, match="no training update runs on cpu: fp32/eager: no kernel; fp32/sdpa: no kernel"):
        measure(tiny_model(), [512], every_size=True)


def test_flash_attention_is_measured_in_16_bits_only(monkeypatch):
    log: list = []
    timings = {"fp32/sdpa": Timing(0.01), "fp16/sdpa": Timing(0.02), "fp32/eager": Timing(0.03)}
    monkeypatch.setattr(calibration, "measure_updates", scripted(timings, log))
    choices = UpdateChoices(("fp16", "fp32"), ("eager", "sdpa", "flash_attention_2"), (False,), True)
    measurement = measure_update(calibration_of(choices), tiny_model(), [4096], every_size=True)
    assert log == [["fp16/sdpa", "fp32/sdpa"], ["fp32/eager"]]  # fp32 won: flash (16 bits only) is not tried
    assert (measurement.precision, measurement.attention) == ("fp32", "sdpa")


def test_a_replan_counts_the_new_shapes_met_and_charges_only_those_still_to_come():
    """On a GPU the first updates meet most of the run's shapes: the Trainer's mean is then above its steady time,
    and charging it to every update still to come would cut the run short."""
    shapes = lambda batches: float(min(batches, 100))  # noqa: E731  (100 shapes, all met in the first 100 batches)
    rules = BudgetRules(EventRule(save_steps=100), False, room=ReplanRoom(first_check=50, shapes_met=shapes))
    plan = plan_of(max_steps=500, warmup_steps=10, save_steps=100, seconds_per_new_shape=0.1)
    clock = BudgetClock(0.0, 10_000.0, now=lambda: 0.0)
    callback = TimeBudgetCallback(plan, clock, rules)
    callback.meter.first, callback.meter.updates, callback.meter.seconds = 0, 45, 9.0  # updates 6-50: 0.2 s each
    # 45 of them met a new shape (0.1 s each): a steady update takes 0.1 s.
    assert callback.steady_rate(50) == pytest.approx(0.1)
    # 97 s usable at 0.1 s: the 50 shapes still to come cost 5 s, so 920 updates fit, not 970.
    usable = BudgetClock(0.0, 100.0 + FINISHING_SECONDS, now=lambda: 0.0).seconds_left(planned=True)
    assert refit(plan, rules, 50, 0.1, usable, 0.0, 0.0).schedule.max_steps == 50 + 920
    no_shapes = BudgetRules(EventRule(save_steps=100), False, room=ReplanRoom(first_check=50))
    assert refit(plan, no_shapes, 50, 0.1, usable, 0.0, 0.0).schedule.max_steps == 50 + 970


def test_the_trainers_own_work_is_the_median_of_paired_differences_on_a_cpu_and_a_windows_on_a_gpu():
    """On a CPU the Trainer's update and the calibration's on the same batches are timed in turns: a load that
    slows both (the third pair) moves neither figure much; the median of the differences is the Trainer's own work."""
    from hf_vanilla_transformer.training.budget.trainer_speed import TrainerTrial, _Pairs, _Window

    pairs = _Pairs(copy_=None, collated=[], accumulation=1, warm=0)
    pairs.pairs = [(0.25, 0.20), (0.25, 0.20), (0.75, 0.62), (0.24, 0.20)]
    trial = pairs.trial()
    assert trial.difference == pytest.approx(0.05) and trial.overhead == pytest.approx(0.05)
    assert trial.trainer_seconds == pytest.approx(0.3725) and trial.calibrated_seconds == pytest.approx(0.305)
    # On a GPU: 12 updates over a 2.4 s window against the calibration's 0.15 s: 0.05 s of the Trainer's own.
    window = _Window(6, 18, synchronize=lambda: None, calibrated=0.15)
    window.seconds = 2.4
    assert window.trial().overhead == pytest.approx(0.05)
    # A Trainer faster than the calibration (a copy timed in a worse moment) counts, down to half the update.
    assert TrainerTrial(0.1, 0.2, -0.1).overhead == pytest.approx(-0.1)
    assert TrainerTrial(0.01, 0.2, -0.19).overhead == pytest.approx(-0.1)
    with pytest.raises(RuntimeError, match="ended before its last update"):
        _Pairs(None, [], 1, 0).trial()


def test_the_budgets_order_ranks_by_the_run_each_candidate_would_be():
    """`fitting.rank`, the order the measuring step ranks the calibration's times by: seconds per update over the
    updates the budget would give (default) or over a run of a given length, the first update of each new shape and
    what is paid once included. A candidate fast on shapes met before but dear on new ones wins a long run and loses
    a short one."""
    settings = types.SimpleNamespace(
        updates={1024: types.SimpleNamespace(accumulation=1, world_size=1)},
        device=torch.device("cpu"),
        recipe=types.SimpleNamespace(max_epochs=None),
    )

    class Sampler:  # 20 batch shapes in all, met one per batch until then
        def __len__(self):
            return 1000

        def shapes_met(self, batches, multiple=1):
            return float(min(batches, 20))

    data = types.SimpleNamespace(batches=types.SimpleNamespace(of=lambda size: Sampler()))
    clock = BudgetClock(0.0, 1000.0 + FINISHING_SECONDS, now=lambda: 0.0)  # 970 training seconds planned into
    inputs = PlanInputs(settings, data, clock, BudgetRules(EventRule(save_steps=100), False))
    dear_shapes, cheap_shapes = Timing(0.10, per_shape=0.5, once=2.0), Timing(0.12)
    assert rank(inputs, dear_shapes, 1024, updates=100) == pytest.approx(0.10 + (2.0 + 0.5 * 20) / 100)
    assert rank(inputs, cheap_shapes, 1024, updates=100) == pytest.approx(0.12)
    budget_updates = math.floor(1000.0 * SAFETY / 0.10)  # what the budget gives the first
    assert rank(inputs, dear_shapes, 1024) == pytest.approx(0.10 + 12.0 / budget_updates)
    assert rank(inputs, dear_shapes, 1024) < rank(inputs, cheap_shapes, 1024)
    assert rank(inputs, dear_shapes, 1024, updates=100) > rank(inputs, cheap_shapes, 1024, updates=100)
