"""The budget's room has one door (issue 49): the package enters `training/budget/` through its `__init__` only, and
the room imports nothing of `training/` outside itself (the Trainer class its trial runs is handed in by the run); its
steps never import the module that calls them, and the calibration hands back times that the measuring step ranks."""

from __future__ import annotations

import ast
import graphlib
from pathlib import Path

from conftest import ROOT


PACKAGE = ROOT / "hf_vanilla_transformer"
ROOM = "hf_vanilla_transformer.training.budget"


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported(path: Path) -> list[tuple[int, str]]:
    """(line, absolute module) of every import of the file at `path`, relative ones resolved (`from . import x`
    names the module x of the package)."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, *([node.module] if node.module else [])])
            found.append((node.lineno, base))
            if not node.module:  # from . import x: the modules x
                found += [(node.lineno, f"{base}.{alias.name}") for alias in node.names]
    return found


def test_the_package_enters_the_budget_room_through_its_init_only():
    doors = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if module_name(path).startswith(ROOM):
            continue
        for line, module in imported(path):
            if module.startswith(ROOM + "."):
                doors.append(f"{path.relative_to(ROOT)}:{line} imports {module}")
    assert not doors, "enter the budget through hf_vanilla_transformer.training.budget:\n" + "\n".join(doors)


def test_the_budget_room_imports_nothing_of_training_outside_itself():
    found = []
    for path in sorted((PACKAGE / "training" / "budget").rglob("*.py")):
        for line, module in imported(path):
            if module.startswith("hf_vanilla_transformer.training") and not module.startswith(ROOM):
                found.append(f"{path.relative_to(ROOT)}:{line} imports {module}")
    assert not found, "\n".join(found)


def room_imports() -> dict[str, set[str]]:
    """Each module of the room (its last name) -> the modules of the room it imports."""
    graph = {}
    for path in sorted((PACKAGE / "training" / "budget").glob("*.py")):
        name = module_name(path)
        inside = {module for _, module in imported(path) if module.startswith(ROOM + ".") and module != name}
        graph[name.rpartition(".")[2]] = {module.rpartition(".")[2] for module in inside}
    return graph


def test_the_plans_steps_return_values_and_never_call_back_into_their_caller():
    """measure -> choose -> fit -> schedule: no module of the room imports one that imports it, however far round
    (graphlib finds the cycle); the calibration, under the measuring step, imports none of the room and takes no
    ranking: it hands its times back (`Calibration.measure_stage`) and the measuring step ranks them
    (`fitting.rank`), says its choice in words and times the chosen update at more batch sizes (as stages of one):
    the calibration times what it is given and decides nothing; and the planner hands no code of its own down to the
    steps it calls (no function or lambda defined inside another)."""
    graph = room_imports()
    graphlib.TopologicalSorter(graph).prepare()  # raises CycleError on a cycle
    assert graph["calibration"] == set() and "calibration" in graph["measuring"] and "fitting" in graph["measuring"]
    budget = PACKAGE / "training" / "budget"
    source = (budget / "calibration.py").read_text(encoding="utf-8")
    functions = [node for node in ast.walk(ast.parse(source)) if isinstance(node, ast.FunctionDef)]
    parameters = {arg.arg for node in functions for arg in node.args.kwonlyargs + node.args.args}
    assert not parameters & {"rank", "order", "best", "score"} and "Callable[[Timing" not in source, parameters
    calibration = next(node for node in ast.parse(source).body if getattr(node, "name", None) == "Calibration")
    assert {node.name for node in calibration.body if isinstance(node, ast.FunctionDef)} == {"batches", "measure_stage"}
    assert "def choice_reasons(" in (budget / "measuring.py").read_text(encoding="utf-8")
    assert "def choice_reasons(" not in source and "reasons=" not in source
    planner = ast.parse((budget / "planner.py").read_text(encoding="utf-8"))
    handed = [
        f"planner.py:{inner.lineno}"
        for outer in ast.walk(planner)
        if isinstance(outer, ast.FunctionDef)
        for inner in ast.walk(outer)
        if inner is not outer and isinstance(inner, (ast.FunctionDef, ast.Lambda))
    ]
    assert not handed, handed


def test_the_import_reader_resolves_relative_imports():
    """The reader the two tests above rely on sees the imports this package writes (a test that cannot fail proves
    nothing: the room's own modules import each other, and the run imports the room)."""
    run = {module for _, module in imported(PACKAGE / "training" / "run.py")}
    assert ROOM in run and "hf_vanilla_transformer.training.settings" in run
    planner = {module for _, module in imported(PACKAGE / "training" / "budget" / "planner.py")}
    assert f"{ROOM}.calibration" in planner and "hf_vanilla_transformer.utils.distributed" in planner


def documented_rule():
    """The rule docs/layout.md shows under "Adding a decision", as the page has it."""
    page = (ROOT / "docs" / "layout.md").read_text(encoding="utf-8")
    section = page[page.index("### Adding a decision") :]
    code = section[section.index("```python\n") + len("```python\n") :]
    namespace: dict = {}
    exec(code[: code.index("```")], namespace)  # the repository's own page
    return namespace["dropout_by_size"]


def dropouts(model) -> set[float]:
    return {module.dropout for module in model.modules() if isinstance(getattr(module, "dropout", None), float)}


def test_a_new_decision_is_one_rule_and_its_line(tmp_path, monkeypatch):
    """The documented dropout-by-size rule, added by its line in `RULES` alone, reaches the run's Trainer's model
    (a tiny model, dropout 0.1 as built: none after the rule) and any plan's model (one as wide as base: 0.1)."""
    from hf_vanilla_transformer.training.arguments import ModelDataArguments, TransformerTrainingArguments
    from hf_vanilla_transformer.training.budget import applying
    from hf_vanilla_transformer.training.run import prepare_run
    from hf_vanilla_transformer.training.settings import settle

    from conftest import FIXTURES, plan_of, tiny_model

    rule = documented_rule()
    monkeypatch.setattr(applying, "RULES", (*applying.RULES, rule))
    train = str(FIXTURES / "libreoffice_help_en_de_200.tsv")
    recipe = ModelDataArguments(
        preset="tiny", vocab_size=300, data_files=train, validation_files=train, test_files=train, dropout=0.1
    )
    args = TransformerTrainingArguments(
        output_dir=str(tmp_path / "run"), max_steps=2, warmup_steps=1, eval_strategy="no", use_cpu=True, report_to=[]
    )
    run = prepare_run(settle(recipe, args))
    assert run.plan.choice.preset in (None, "tiny") and dropouts(run.trainer.model) == {0.0}
    assert run.trainer.model.config.dropout == 0.0
    model = tiny_model(dropout=0.0, d_model=512)
    applying.apply_plan(plan_of(preset="base", peak_learning_rate=1e-3), args, model)
    assert dropouts(model) == {0.1} and model.config.dropout == 0.1
