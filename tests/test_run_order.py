"""A run reads top to bottom (issue 37): the functions of training/ that receive the run's arguments or its plan,
counted on real budgeted runs of the tiny model, as hops in the order they are first called: at most 14 from
`train_and_evaluate` to `results.json` on a fresh corpus, at most 4 of them back into a file already left, and at
most 4 more for a run that starts again with another choice.

A hop is a call, made by a function of training/, of a function of training/ that receives (as a parameter other
than `self`) the recipe, the Trainer's arguments, the settled run or the plan, or a dataclass holding one of them.
Calls the Trainer makes (its callbacks' hooks) are not the run's own and are not counted."""

from __future__ import annotations

import dataclasses
import sys
import time
from pathlib import Path

import pytest
from transformers import TrainingArguments

from hf_vanilla_transformer.training.arguments import ModelDataArguments
from hf_vanilla_transformer.training.budget import deadline
from hf_vanilla_transformer.training.budget.plan import BudgetPlan
from hf_vanilla_transformer.training.budget.replanning import Switch
from hf_vanilla_transformer.training.recipes import parse_run
from hf_vanilla_transformer.training.run import train_and_evaluate
from hf_vanilla_transformer.training.settings import RunSettings

from conftest import FIXTURES, ROOT


TRAINING = str(ROOT / "hf_vanilla_transformer" / "training") + "/"
CARRIERS = (ModelDataArguments, TrainingArguments, RunSettings, BudgetPlan)


def carries(value, nested: bool = True) -> bool:
    """Whether `value` is the run's arguments or plan, or a dataclass holding one."""
    if isinstance(value, CARRIERS):
        return True
    if nested and dataclasses.is_dataclass(value) and not isinstance(value, type):
        return any(carries(getattr(value, f.name, None), nested=False) for f in dataclasses.fields(value))
    return False


class Hops:
    """Records every hop (see the module docstring) as (file, function) while active; `switched_at` is the index of
    the hop whose decision was a switch to another choice."""

    def __init__(self):
        self.calls: list[tuple[str, str]] = []
        self.switched_at: int | None = None

    def __call__(self, frame, event, arg):
        code = frame.f_code
        if event != "call" or not code.co_filename.startswith(TRAINING):
            return
        caller = frame.f_back
        if caller is None or not caller.f_code.co_filename.startswith(TRAINING):
            return
        names = code.co_varnames[: code.co_argcount + code.co_kwonlyargcount]
        values = [frame.f_locals.get(name) for name in names if name != "self"]
        if any(isinstance(value, Switch) for value in values) and self.switched_at is None:
            self.switched_at = len(self.calls)
        if any(carries(value) for value in values):
            self.calls.append((code.co_filename[len(TRAINING) :], code.co_qualname))

    def first_visits(self, calls=None) -> list[tuple[str, str]]:
        seen: dict = {}
        for call in self.calls if calls is None else calls:
            seen.setdefault(call, None)
        return list(seen)

    def back(self, hops: list[tuple[str, str]]) -> list[tuple[str, str]]:
        """The hops into a file the run had left for another."""
        left, previous, found = set(), None, []
        for file, function in hops:
            if previous is not None and file != previous:
                if file in left:
                    found.append((file, function))
                left.add(previous)
            previous = file
        return found


def traced(settings: RunSettings) -> tuple[Hops, dict]:
    hops = Hops()
    sys.setprofile(hops)
    try:
        results = train_and_evaluate(settings, started=time.time())
    finally:
        sys.setprofile(None)
    return hops, results


def tiny_run(output: Path, *flags: str) -> RunSettings:
    """The cpu recipe's budgeted run of the tiny model on the 200-pair fixture, into `output`."""
    test = str(FIXTURES / "libreoffice_help_en_de_test_40.tsv")
    return parse_run(
        [
            *("--recipe", "cpu", "--preset", "tiny", "--max_minutes", "1", "--output_dir", str(output)),
            *("--data_files", str(FIXTURES / "libreoffice_help_en_de_200.tsv"), "--validation_files", test),
            *("--test_files", test, "--max_eval_samples", "10", "--disable_tqdm", "true", "--source_check", "warn"),
            *("--report_to", "none", "--test_beams", "1", "--length_penalty_choices", ""),
            *flags,
        ]
    )


@pytest.mark.slow
def test_a_budgeted_runs_arguments_and_plan_take_at_most_14_hops(tmp_path):
    hops, results = traced(tiny_run(tmp_path / "run", "--data_cache_dir", str(tmp_path / "cache")))
    assert results["plan"]["max_minutes"] == 1
    order = hops.first_visits()
    listed = "\n".join(f"{file}:{function}" for file, function in order)
    assert len(order) <= 14, listed
    assert len(hops.back(order)) <= 4, (hops.back(order), listed)
    assert order[0] == ("run.py", "_train_and_evaluate") and ("results.py", "run_results") in order


@pytest.mark.slow
def test_a_run_that_starts_again_adds_at_most_4_hops(tmp_path, monkeypatch):
    def switch_to_the_first(candidates, current, rules, ratio, *args):  # as if the Trainer were 3x faster
        first = candidates[0]
        return Switch(first["preset"], first["max_tokens"], first["accumulation"], first["seconds_per_update"] / 3, 40)

    monkeypatch.setattr(deadline, "better_candidate", switch_to_the_first)
    choices = ("--preset_choices", "compact,tiny", "--preset", "compact", "--min_updates", "1000000000")
    fixed = ("--precision", "fp32", "--attn_implementation", "sdpa", "--vocab_size", "500", "--max_epochs", "1000")
    hops, results = traced(tiny_run(tmp_path / "run", *choices, *fixed, "--max_minutes", "3"))
    assert results["plan"]["switched_from"]["preset"] == "tiny" and hops.switched_at is not None
    before = set(hops.calls[: hops.switched_at + 1])
    second = [i for i, call in enumerate(hops.calls) if call == ("budget/deadline.py", "TimeBudgetCallback.__init__")]
    restart = hops.first_visits(hops.calls[hops.switched_at + 1 : second[1] + 1])
    added = [call for call in restart if call not in before]
    assert len(added) <= 4, added
