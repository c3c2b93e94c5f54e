"""The walk of a budgeted run (tests/test_run_order.py) and the fewest file entries and returns a layout of today's
functions could give it: issue 49's goal (at most 30 entries and 10 returns) asked of the layout alone.

The walk is traced as the test traces it: a tiny budgeted run on the 200-pair fixture, a fresh corpus. Each unit of
the walk (a top-level function, or a class with its methods) keeps its place in it; a seeded search (simulated
annealing) moves whole units between files of at most `--lines` lines of walked code (what else a file holds is not
counted), the budget's room apart from the rest of training/ (budget/ imports nothing of training/ outside itself),
starting from today's files, and keeps the layout with the fewest returns, then entries. Units stay inside
training/ and whole (a class is not split). What it finds, moving today's functions reaches for today's call order;
it is a search, not a proof, and cannot say that no better layout exists. The walk itself depends on the machine's
timing (a deadline or a re-plan adds calls): the counts are those of the walk traced.

    python scripts/walk_layout_probe.py [--lines 430] [--restarts 12] [--moves 200000] [--seed 0] [--mix_rooms]

It prints today's walk, its counts and the best layout found, a file per line (its units, and their files today).
"""

from __future__ import annotations

import argparse
import ast
import math
import random
import sys
import tempfile
import time
from pathlib import Path


TESTS = Path(__file__).resolve().parent.parent / "tests"


def traced_walk():
    """((file under training/, qualified name) of each function of the walk, in the order first called; the test's
    `marked`, which counts a walk's entries and returns; today's (entries, returns))."""
    sys.path.insert(0, str(TESTS))
    import test_run_order as walk  # the test's own tracer and run

    with tempfile.TemporaryDirectory() as folder:
        settings = walk.tiny_run(Path(folder) / "run", "--data_cache_dir", str(Path(folder) / "cache"))
        traced, _ = walk.traced(settings)
    order = walk.first_visits(traced.calls)
    if not order:
        raise SystemExit("no function of training/ was traced: is the package imported the checkout tests/ is in?")
    lines, entries, returns = walk.marked(order)
    print("\n".join(lines))
    print(f"today: {len(order)} functions, {entries} file entries, {returns} returns")
    return order, walk.marked, (entries, returns)


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
    previous, left, entries, returns = None, set(), 0, 0
    for unit in sequence:
        file = files[unit]
        if file != previous:
            entries, returns = entries + 1, returns + (file in left)
            if previous is not None:
                left.add(previous)
            previous = file
    return entries, returns


def search(sequence, sizes, rooms, start, most_lines, moves, rng) -> tuple[tuple[int, int], list[int]]:
    """One annealing run from the layout `start`: ((returns, entries), layout) of the best layout met."""
    files, load, room = list(start), {}, {}
    for unit, file in enumerate(files):
        load[file] = load.get(file, 0) + sizes[unit]
        room[file] = rooms[unit]
    entries, returns = counts(sequence, files)
    cost, best = entries + 3 * returns, ((returns, entries), list(files))
    temperature, units = 3.0, len(files)
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
        entries, returns = counts(sequence, files)
        new = entries + 3 * returns
        if new <= cost or rng.random() < math.exp((cost - new) / temperature):
            load[was] -= sizes[unit]
            load[target], room[target], cost = load.get(target, 0) + sizes[unit], rooms[unit], new
            best = min(best, ((returns, entries), list(files)))
        else:
            files[unit] = was
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    parser.add_argument("--lines", type=int, default=430, help="most lines of walked code in a file")
    parser.add_argument("--restarts", type=int, default=12)
    parser.add_argument("--moves", type=int, default=200_000, help="moves tried in each restart")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--mix_rooms", action="store_true", help="let budget/ and the rest of training/ share files")
    options = parser.parse_args()
    from hf_vanilla_transformer import training

    order, marked, today_counts = traced_walk()
    every = unit_sizes(Path(training.__file__).parent)
    of_unit = {}  # (file, top-level name) -> its index, in the order first called
    sequence = [of_unit.setdefault((file, name.split(".")[0]), len(of_unit)) for file, name in order]
    units = list(of_unit)
    sizes = [every[unit] for unit in units]
    rooms = [0 if options.mix_rooms else int(file.startswith("budget/")) for file, _ in units]
    today = [sorted({file for file, _ in units}).index(file) for file, _ in units]
    if counts(sequence, today) != today_counts:
        raise SystemExit(f"counted by unit, today's walk gives {counts(sequence, today)}, not {today_counts}")
    rng, started, best = random.Random(options.seed), time.time(), None
    for restart in range(options.restarts):
        found = search(sequence, sizes, rooms, today, options.lines, options.moves, rng)
        print(f"restart {restart}: {found[0][1]} entries, {found[0][0]} returns ({time.time() - started:.0f} s)")
        best = min(best or found, found)
    (returns, entries), files = best
    print(f"best layout found: {entries} file entries, {returns} returns, files of at most {options.lines} lines")
    lines, _, _ = marked([(str(files[unit]), f"{units[unit][1]} ({units[unit][0]})") for unit in sequence])
    print("its returns, at: " + ", ".join(line.split(":", 1)[1] for line in lines if line.startswith("<")))
    for file in dict.fromkeys(files[unit] for unit in sequence):
        members = [units[unit] for unit in range(len(units)) if files[unit] == file]
        print(f"{sum(every[unit] for unit in members):4d} lines: " + ", ".join(f"{n} ({f})" for f, n in members))


if __name__ == "__main__":
    main()
