"""A run reads top to bottom (issues 37 and 49): every function of training/ a real budgeted run of the tiny model calls
on a fresh corpus, traced.

The walk is the order in which the run first calls each function of training/ (a call made by a function of training/:
the Trainer's calls of its callbacks' hooks are not the run's own; a comprehension, a lambda or a function defined
inside another counts as the function it is written in). The run enters a file each time that order moves to another
file, and returns to one when it enters a file it had left. The test prints the walk, each function marked where it
enters a file (>) or returns to one (<).

Issue 49's own count (its goal: at most 30 entries and 10 returns) is the same over the functions first called from
another file (`Walk.entering`): a call within a file enters none, so a file's helpers called after it was left do not
count. Measured on the code the issue described (866f8d3), it gives 57 entries and 35 returns, the issue's "about 56 and
34"; the walk gives 83 and 60 there. Both are held here and printed.

The walk, measured on 866f8d3: 150 functions, 83 file entries, 60 returns; 165, 88 and 63 on e81e45f. The plan's stages
now hand values forward (the batches read from the data room, the test split a value, the rate and the Trainer's
scheduler in one module, the callback's meter and event spacing its own): 155 functions, 60 entries, 35 returns; with
the calibration handing its times back to the measuring step that ranks them, 156, 60, 35; with the finishing steps in a
file of their own and leaving the process group in utils/distributed.py, 155, 59, 33, as it stays with the plan said
where it is made and written, the fit's figures of the plan gathered after its schedule (with the re-plans' rules) and
the new shapes' seconds re-fitted in replanning.py. Issue 49's count: 46 entries and 21 returns before these three, 42
and 17 after; with the budget checked at the run's start (before the corpus is read) and the measuring step timing its
chosen update at more batch sizes and saying its choice itself (the calibration only times what it is given), 41 and 16,
the walk 155, 58, 32 (docs/layout.md). The issue's goal of 30 entries and 10 returns is retired (2026-12-02); the
ceilings stay where they were then, with room for what a slower or loaded machine's timing adds to the same code's walk:
a re-plan at the first check of the speed (its refit and the callback acting on it), a deadline. On the 2-core AMD EPYC
Zen 3 (AVX2 only) of 2026-12-02 the tiny run re-plans at its first check and its validation plateaus: 163 functions, 64
entries, 38 returns (issue 49's count 45 and 20), where the idle AMX Xeon walked 58 and 32; CI's machine walked 63. On
2026-12-07 the idle Zen 4 walked 66 and 40 and CI's machine 67 and 41 (its plateau's stop said by a helper of its own);
the plateau now says it where it decides it, calling nothing new, and three moves (docs/layout.md) took three of each
back: 63 and 37 (46 and 21) on the Zen 4. A run that starts again with another choice (its switch, the settings switched
to, the plan of a known choice) adds at most `MOST_ADDED_BY_A_RESTART` functions it had not called before the switch."""

from __future__ import annotations

import re
import sys
import time
from pathlib import Path

import pytest

from hf_vanilla_transformer.training.budget import deadline
from hf_vanilla_transformer.training.budget.replanning import Switch
from hf_vanilla_transformer.training.recipes import parse_run
from hf_vanilla_transformer.training.run import train_and_evaluate
from hf_vanilla_transformer.training.settings import RunSettings

from conftest import FIXTURES, ROOT


TRAINING = str(ROOT / "hf_vanilla_transformer" / "training") + "/"
INNER = re.compile(r"<(listcomp|dictcomp|setcomp|genexpr|lambda)>|<locals>")
MOST_ENTRIES = 66
MOST_RETURNS = 40
MOST_CALLED_ENTRIES = 47
MOST_CALLED_RETURNS = 22
MOST_ADDED_BY_A_RESTART = 9


class Walk:
    """Records, while active, every call of a function of training/ made by one (see the module docstring) as
    (file, function) in `calls`, its caller beside it in `callers` (file, function), and the index of the first call
    that receives a switch to another choice (`switched_at`)."""

    def __init__(self):
        self.calls: list[tuple[str, str]] = []
        self.callers: list[tuple[str, str]] = []
        self.switched_at: int | None = None

    @property
    def entering(self) -> list[tuple[str, str]]:
        """The calls made from another file (issue 49's count: a call within a file enters none)."""
        return [call for call, caller in zip(self.calls, self.callers, strict=True) if caller[0] != call[0]]

    def __call__(self, frame, event, arg):
        code = frame.f_code
        if event != "call" or not code.co_filename.startswith(TRAINING) or INNER.search(code.co_qualname):
            return
        caller = frame.f_back
        if caller is None or not caller.f_code.co_filename.startswith(TRAINING):
            return
        if self.switched_at is None:
            names = code.co_varnames[: code.co_argcount + code.co_kwonlyargcount]
            if any(isinstance(frame.f_locals.get(name), Switch) for name in names):
                self.switched_at = len(self.calls)
        self.calls.append((code.co_filename[len(TRAINING) :], code.co_qualname))
        self.callers.append((caller.f_code.co_filename[len(TRAINING) :], caller.f_code.co_qualname))


def first_visits(calls: list[tuple[str, str]]) -> list[tuple[str, str]]:
    return list(dict.fromkeys(calls))


def marked(order: list[tuple[str, str]]) -> tuple[list[str], int, int]:
    """(the walk's lines, each marked where it enters a file (>) or returns to one it had left (<); the entries;
    the returns)."""
    lines, left, entries, returns = [], set(), 0, 0
    for index, (file, function) in enumerate(order):
        previous = order[index - 1][0] if index else None
        mark = " " if file == previous else "<" if file in left else ">"
        entries, returns = entries + (mark != " "), returns + (mark == "<")
        if previous is not None and file != previous:
            left.add(previous)
        lines.append(f"{mark} {file}:{function}")
    return lines, entries, returns


def traced(settings: RunSettings, walk: Walk | None = None) -> tuple[Walk, dict]:
    """The run of `settings`, walked into `walk` (a new one where None: one given keeps what a run that raises
    walked)."""
    walk = walk or Walk()
    sys.setprofile(walk)
    try:
        results = train_and_evaluate(settings, started=time.time())
    finally:
        sys.setprofile(None)
    return walk, results


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


def test_the_walk_marks_entries_and_returns():
    """The counting the ceilings rely on, on a walk written out (a test that cannot fail proves nothing)."""
    order = [("a.py", "f"), ("a.py", "g"), ("b.py", "h"), ("c.py", "i"), ("a.py", "j"), ("b.py", "k")]
    lines, entries, returns = marked(order)
    assert (entries, returns) == (5, 2)
    assert [line[0] for line in lines] == [">", " ", ">", ">", "<", "<"]
    assert INNER.search("f.<locals>.<listcomp>") and not INNER.search("Planner.plan")
    assert first_visits([("a", "f"), ("b", "g"), ("a", "f")]) == [("a", "f"), ("b", "g")]
    # Issue 49's count keeps the calls made from another file: a.py's g, called by f, enters no file.
    walk = Walk()
    walk.calls, walk.callers = (
        [("a.py", "g"), ("b.py", "h"), ("a.py", "j")],
        [("a.py", "f"), ("a.py", "g"), ("b.py", "h")],
    )
    assert walk.entering == [("b.py", "h"), ("a.py", "j")] and marked(walk.entering)[1:] == (2, 0)


@pytest.mark.slow
def test_a_budgeted_run_enters_few_files_and_returns_to_few(tmp_path):
    walk, results = traced(tiny_run(tmp_path / "run", "--data_cache_dir", str(tmp_path / "cache")))
    assert results["plan"]["max_minutes"] == 1
    order = first_visits(walk.calls)
    lines, entries, returns = marked(order)
    path = "\n".join(lines)
    print(f"{len(order)} functions, {entries} file entries, {returns} returns to a file already left:\n{path}")
    # Issue 49's count: the same, over the functions first called from another file (a call within a file enters none).
    called = first_visits(walk.entering)
    called_lines, called_entries, called_returns = marked(called)
    calls = "\n".join(called_lines)
    print(f"issue 49's count: {called_entries} file entries, {called_returns} returns to a file already left:\n{calls}")
    assert entries <= MOST_ENTRIES and returns <= MOST_RETURNS, path
    assert called_entries <= MOST_CALLED_ENTRIES and called_returns <= MOST_CALLED_RETURNS, calls
    assert ("run.py", "_train_and_evaluate") not in called  # run.py calls it itself
    assert order[0] == ("run.py", "_train_and_evaluate") and ("results.py", "run_results") in order
    # The walk sees what a count of the plan's carriers did not: the plan's own steps.
    assert {"budget/planner.py", "budget/measuring.py", "budget/fitting.py", "budget/applying.py"} <= {
        file for file, _ in order
    }, path


class Restarted(Exception):
    """Raised where the run that starts again begins to train: the walk has what the test counts."""


@pytest.mark.slow
def test_a_run_that_starts_again_adds_few_functions(tmp_path, monkeypatch):
    def switch_to_the_first(candidates, current, rules, ratio, *args):  # as if the Trainer were 3x faster
        first = candidates[0]
        return Switch(first["preset"], first["max_tokens"], first["accumulation"], first["seconds_per_update"] / 3, 40)

    begun = []
    begin = deadline.TimeBudgetCallback.on_train_begin

    def begin_once(callback, *args, **kwargs):  # the Trainer calls it: the walk does not count the call
        begun.append(callback.plan)
        if len(begun) == 2:  # the run switched to: its first steps are not the restart's (about 2 minutes of CI)
            raise Restarted
        return begin(callback, *args, **kwargs)

    monkeypatch.setattr(deadline, "better_candidate", switch_to_the_first)
    monkeypatch.setattr(deadline.TimeBudgetCallback, "on_train_begin", begin_once)
    choices = ("--preset_choices", "compact,tiny", "--preset", "compact", "--min_updates", "1000000000")
    fixed = ("--precision", "fp32", "--attn_implementation", "sdpa", "--vocab_size", "500", "--max_epochs", "1000")
    walk = Walk()
    with pytest.raises(Restarted):
        traced(tiny_run(tmp_path / "run", *choices, *fixed, "--max_minutes", "3"), walk)
    assert begun[0].choice.preset == "tiny" and begun[1].choice.preset == "compact"
    assert begun[1].history.switched_from["preset"] == "tiny" and walk.switched_at is not None
    before = set(walk.calls[: walk.switched_at + 1])
    callbacks = [
        i for i, call in enumerate(walk.calls) if call == ("budget/deadline.py", "TimeBudgetCallback.__init__")
    ]
    restart = first_visits(walk.calls[walk.switched_at + 1 : callbacks[1] + 1])
    added = [call for call in restart if call not in before]
    assert len(added) <= MOST_ADDED_BY_A_RESTART, added
