"""The walk of a budgeted run (tests/test_run_order.py) and the layouts of today's functions that would shorten it:
issue 49's goal (at most 30 entries and 10 returns) asked of the layout alone.

The walk is traced as the test traces it: a tiny budgeted run on the 200-pair fixture, a fresh corpus, and counted
as the test counts it: `--count walk` every function first called, `--count calls` those first called from another
file (issue 49's own count, `Walk.entering`: moving a unit changes which calls cross a file). Each unit (a top-level
function, or a class with its methods) keeps its place in the run; a seeded search (simulated annealing) moves whole
units between files of at most `--lines` lines of walked code (what else a file holds is not counted), the budget's
room apart from the rest of training/ (budget/ imports nothing of training/ outside itself; `--mix_rooms` drops
that), starting from today's files. It keeps the layout with the fewest returns, then entries; with `--goal E,R`,
the layout within E entries and R returns that moves the fewest units from today's files, and lists those moves.
Units stay inside training/ and whole (a class is not split). It is a search, not a proof, and cannot say that no
better layout exists. The walk itself depends on the machine's timing (a deadline or a re-plan adds calls): the
counts are those of the walk traced.

    python scripts/walk_layout_probe.py [--count walk|calls] [--goal 30,10] [--lines 430] [--restarts 12]
                                        [--moves 200000] [--seed 0] [--mix_rooms]
    python scripts/walk_layout_probe.py --move budget/clock.py=budget/fitting.py --drop results.py:_training ...

It prints today's walk, its counts and the best layout found, a file per line (its units, and their files today),
or, with `--goal`, the units it moves. With `--move` or `--drop` it searches nothing: it replays the traced walk with
those changes, counted as issue 49 counts (`--count calls`), and prints the path. `--move FROM=TO` puts a file, a
unit (`file:Class`) or one function (`file:Class.method`) in the file TO; `--drop file:function` removes every call
of that function (a call replaced by a value) and the calls it made itself (deeper ones are still counted).
"""

from __future__ import annotations

import argparse
import ast
import functools
import math
import random
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path


TESTS = Path(__file__).resolve().parent.parent / "tests"


def traced_walk():
    """(the test's Walk of a tiny budgeted run, traced as the test traces it; the test's module, for its `marked`
    and `first_visits`)."""
    sys.path.insert(0, str(TESTS))
    import test_run_order as walk  # the test's own tracer and run

    with tempfile.TemporaryDirectory() as folder:
        settings = walk.tiny_run(Path(folder) / "run", "--data_cache_dir", str(Path(folder) / "cache"))
        traced, _ = walk.traced(settings)
    if not traced.calls:
        raise SystemExit("no function of training/ was traced: is the package imported the checkout tests/ is in?")
    return traced, walk


def unit_sizes(root: Path) -> dict[tuple[str, str], int]:
    """The lines of every top-level function and class of training/, by (file, name)."""
    sizes = {}
    for path in root.rglob("*.py"):
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.FunctionDef | ast.ClassDef):
                sizes[(str(path.relative_to(root)), node.name)] = node.end_lineno - node.lineno + 1
    return sizes


def counts(sequence: list[int], files: list[int]) -> tuple[int, int]:
    """(entries, returns) of the walk of units `sequence` with unit i in file `files[i]`: the test's `marked`, without
    the lines it writes (the search counts a million layouts; `main` checks the two agree on today's)."""
    return switches([files[unit] for unit in sequence])


def switches(walked: list[int]) -> tuple[int, int]:
    """(entries, returns) of a walk through the files `walked`, one per function: `marked`'s count."""
    previous, left, entries, returns = None, set(), 0, 0
    for file in walked:
        if file != previous:
            entries, returns = entries + 1, returns + (file in left)
            if previous is not None:
                left.add(previous)
            previous = file
    return entries, returns


def calls_counter(calls, callers, unit_of: dict) -> Callable[[list[int]], tuple[int, int]]:
    """Issue 49's count for a layout (file of unit i: `files[i]`): the walk over the functions first called from
    another file, as the test counts it (`Walk.entering`), where a unit's move changes which calls cross a file.
    `unit_of` indexes the units, (file, top-level name), of the callees and callers."""
    table = {}  # callee function -> (its unit, [(first call from a caller unit, that unit)])
    for position, ((file, name), (caller_file, caller)) in enumerate(zip(calls, callers, strict=True)):
        _, pairs = table.setdefault((file, name), (unit_of[(file, name.split(".")[0])], {}))
        pairs.setdefault(unit_of[(caller_file, caller.split(".")[0])], position)
    rows = [(unit, sorted((position, caller) for caller, position in pairs.items())) for unit, pairs in table.values()]

    def count(files: list[int]) -> tuple[int, int]:
        firsts = []
        for unit, pairs in rows:
            file = files[unit]
            for position, caller in pairs:
                if files[caller] != file:
                    firsts.append((position, file))
                    break
        firsts.sort()
        return switches([file for _, file in firsts])

    return count


def search(score, sizes, rooms, start, most_lines, moves, rng, temperature=3.0) -> tuple[tuple, list[int]]:
    """One annealing run from the layout `start`: (key, layout) of the layout met with the lowest key, `score(files)`
    giving (the cost the annealing lowers, the key it is kept by)."""
    files, load, room = list(start), {}, {}
    for unit, file in enumerate(files):
        load[file] = load.get(file, 0) + sizes[unit]
        room[file] = rooms[unit]
    cost, key = score(files)
    best, units = (key, list(files)), len(files)
    for _ in range(moves):
        temperature = max(0.05, temperature * 0.99997)  # every move tried cools, refused or not
        unit = rng.randrange(units)
        target = files[rng.randrange(units)] if rng.random() < 0.9 else rng.randrange(2 * units)
        was = files[unit]
        if target == was or load.get(target, 0) + sizes[unit] > most_lines:
            continue
        if load.get(target, 0) and room[target] != rooms[unit]:
            continue
        files[unit] = target
        new, key = score(files)
        if new <= cost or rng.random() < math.exp((cost - new) / temperature):
            load[was] -= sizes[unit]
            load[target], room[target], cost = load.get(target, 0) + sizes[unit], rooms[unit], new
            best = min(best, (key, list(files)))
        else:
            files[unit] = was
    return best


def fewest_returns(count):
    """The search's score for the fewest returns, then entries: (entries + 3 returns, (returns, entries))."""

    def score(files):
        entries, returns = count(files)
        return entries + 3 * returns, (returns, entries)

    return score


def fewest_moves(count, today: list[int], goal: tuple[int, int]):
    """The search's score for the fewest units moved from `today`'s files within `goal` (most entries, most returns):
    each entry or return over it weighs 40 moves; key (over the goal, units moved, returns, entries)."""

    def score(files):
        entries, returns = count(files)
        over = max(0, entries - goal[0]) + max(0, returns - goal[1])
        moved = sum(file != was for file, was in zip(files, today, strict=True))
        return 40 * over + moved, (over, moved, returns, entries)

    return score


def entries_and_returns(text: str) -> tuple[int, int]:
    """`--goal`'s value: two whole numbers, "30,10"."""
    parts = text.split(",")
    if len(parts) != 2 or not all(part.strip().isdigit() for part in parts):
        raise argparse.ArgumentTypeError(f"--goal {text!r}: expected ENTRIES,RETURNS, two whole numbers such as 30,10")
    return int(parts[0]), int(parts[1])


def replayed(calls, callers, moves: dict[str, str], drops: set[str]) -> list[tuple[str, str]]:
    """The functions first called from another file (issue 49's count, `Walk.entering`) once `moves` (a file, a
    unit `file:Class` or a function `file:Class.method` -> its new file) and `drops` (`file:function`: its calls
    removed) are applied to the traced `calls` and their `callers`."""

    def where(file: str, name: str) -> str:
        parts = name.split(".")
        for key in (f"{file}:{name}", f"{file}:{'.'.join(parts[:2])}", f"{file}:{parts[0]}", file):
            if key in moves:
                return moves[key]
        return file

    entering = []
    for (file, name), (caller_file, caller) in zip(calls, callers, strict=True):
        # (a comprehension, a lambda or a function inside the dropped one is its own: the walk counts it as that one)
        if f"{file}:{name}" in drops or f"{caller_file}:{caller.split('.<locals>')[0]}" in drops:
            continue
        if where(file, name) != where(caller_file, caller):
            entering.append((where(file, name), name))
    return entering


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    parser.add_argument("--lines", type=int, default=430, help="most lines of walked code in a file")
    parser.add_argument("--restarts", type=int, default=12)
    parser.add_argument("--moves", type=int, default=200_000, help="moves tried in each restart")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--mix_rooms", action="store_true", help="let budget/ and the rest of training/ share files")
    parser.add_argument(
        "--count", choices=("walk", "calls"), default="walk",
        help="walk: every function first called (the test's walk); calls: those first called from another file "
        "(issue 49's own count, Walk.entering), where moving a unit changes which calls cross a file",
    )  # fmt: skip
    parser.add_argument(
        "--goal",
        type=entries_and_returns,
        default=None,
        help="ENTRIES,RETURNS: the fewest units moved from today's files that reach it instead",
    )
    parser.add_argument(
        "--move",
        action="append",
        default=[],
        metavar="FROM=TO",
        help="replay with a file, unit or function (file:Class.method) moved to the file TO; searches nothing",
    )
    parser.add_argument(
        "--drop",
        action="append",
        default=[],
        metavar="FILE:FUNCTION",
        help="replay with every call of that function removed (replaced by a value); searches nothing",
    )
    options = parser.parse_args()
    moves = dict(move.split("=", 1) for move in options.move if "=" in move)
    if len(moves) != len(options.move):
        parser.error(f"--move {options.move}: expected FROM=TO, such as budget/clock.py=budget/fitting.py")
    from hf_vanilla_transformer import training

    walk, test = traced_walk()
    if moves or options.drop:
        lines, entries, returns = test.marked(
            test.first_visits(replayed(walk.calls, walk.callers, moves, set(options.drop)))
        )
        print("\n".join(lines))
        print(f"replayed: {entries} file entries, {returns} returns (issue 49's count)")
        return
    order = test.first_visits(walk.calls)
    every = unit_sizes(Path(training.__file__).parent)
    of_unit = {}  # (file, top-level name) -> its index, in the order first called (then the callers' own)
    sequence = [of_unit.setdefault((file, name.split(".")[0]), len(of_unit)) for file, name in order]
    if options.count == "calls":  # the callers' units too: where they are decides which calls cross a file
        for file, name in walk.callers:
            of_unit.setdefault((file, name.split(".")[0]), len(of_unit))
    units = list(of_unit)
    unknown = [unit for unit in units if unit not in every]  # (a module's own code, calling at import: not movable)
    if unknown:
        raise SystemExit(f"units that are no top-level function or class of training/: {unknown}")
    sizes = [every[unit] for unit in units]
    rooms = [0 if options.mix_rooms else int(file.startswith("budget/")) for file, _ in units]
    names = sorted({file for file, _ in units})  # today's files; a layout's file i < len(names) is names[i]
    today = [names.index(file) for file, _ in units]
    if options.count == "calls":
        count = calls_counter(walk.calls, walk.callers, of_unit)
        lines, *counted = test.marked(test.first_visits(walk.entering))
    else:
        count = functools.partial(counts, sequence)
        lines, *counted = test.marked(order)
    print("\n".join(lines))
    print(f"today: {len(order)} functions, {counted[0]} file entries, {counted[1]} returns ({options.count})")
    if count(today) != tuple(counted):
        raise SystemExit(f"counted by unit, today's layout gives {count(today)}, not {tuple(counted)}")
    if options.goal:
        score, temperature = fewest_moves(count, today, options.goal), 20.0
    else:
        score, temperature = fewest_returns(count), 3.0
    rng, started, best = random.Random(options.seed), time.time(), None
    for restart in range(options.restarts):
        found = search(score, sizes, rooms, today, options.lines, options.moves, rng, temperature)
        entries, returns = count(found[1])
        print(f"restart {restart}: {entries} entries, {returns} returns, {found[0]} ({time.time() - started:.0f} s)")
        best = min(best or found, found)
    files = best[1]
    entries, returns = count(files)
    print(f"best layout found: {entries} file entries, {returns} returns, files of at most {options.lines} lines")
    if options.goal:
        moved = [(units[unit], files[unit]) for unit in range(len(units)) if files[unit] != today[unit]]
        print(f"{len(moved)} of {len(units)} units moved from today's files" + (":" if moved else ""))
        for (file, name), target in moved:
            print(f"  {name} ({file}) -> {names[target] if target < len(names) else f'a new file {target}'}")
        return
    if options.count == "walk":
        lines, _, _ = test.marked([(str(files[unit]), f"{units[unit][1]} ({units[unit][0]})") for unit in sequence])
        print("its returns, at: " + ", ".join(line.split(":", 1)[1] for line in lines if line.startswith("<")))
    for file in dict.fromkeys(files[unit] for unit in range(len(units))):
        members = [units[unit] for unit in range(len(units)) if files[unit] == file]
        print(f"{sum(every[unit] for unit in members):4d} lines: " + ", ".join(f"{n} ({f})" for f, n in members))


if __name__ == "__main__":
    main()
