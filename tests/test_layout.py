"""The house rules of the package's tree: rooms that import only the rooms before them in the layout map's order
(and no import circle), functions of one screen and modules of a few hundred lines (the modeling file excepted), and
a map (docs/layout.md) that names every module."""

from __future__ import annotations

import ast
from pathlib import Path

from conftest import ROOT


PACKAGE = ROOT / "hf_vanilla_transformer"
LONGEST_FUNCTION = 60  # lines from the `def` to the end, the docstring left out
LARGEST_MODULE = 450  # lines, for every module but the modeling file (the paper's §3 in one file)


def modules() -> dict[str, Path]:
    """{dotted name: file} of every module of the package."""
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        found[name] = path
    return found


def imported_modules(name: str, path: Path, known: set[str]) -> set[str]:
    """The package's modules that `name` imports anywhere in its file (inside functions too)."""
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                target = ".".join([*base, node.module] if node.module else base)
            else:
                target = node.module or ""
            candidates = [target] + [f"{target}.{alias.name}" for alias in node.names]
        elif isinstance(node, ast.Import):
            candidates = [alias.name for alias in node.names]
        else:
            continue
        found |= {candidate for candidate in candidates if candidate in known and candidate != name}
    return found


def test_no_module_of_the_package_imports_itself_through_others():
    files = modules()
    graph = {name: imported_modules(name, path, set(files)) for name, path in files.items()}
    # The package's __init__ imports its rooms to register the model; a room importing the package root is no circle
    # (Python has run the root first), so the root's own edges are left out.
    graph["hf_vanilla_transformer"] = set()
    circles = []

    def visit(name: str, path: list[str]) -> None:
        for target in sorted(graph[name]):
            if target in path:
                circles.append([*path[path.index(target) :], target])
            elif target not in done:
                visit(target, [*path, target])
        done.add(name)

    done: set[str] = set()
    for name in sorted(graph):
        if name not in done:
            visit(name, [name])
    assert not circles, circles


def test_the_model_room_imports_nothing_of_the_rest_of_the_package():
    files = modules()
    for name, path in files.items():
        if name.startswith("hf_vanilla_transformer.model."):
            outside = {
                target
                for target in imported_modules(name, path, set(files))
                if not target.startswith("hf_vanilla_transformer.model")
            }
            assert not outside, (name, outside)


def test_functions_fit_one_screen_and_modules_a_few_hundred_lines():
    too_long, too_large = [], []
    for name, path in modules().items():
        text = path.read_text(encoding="utf-8")
        if len(text.splitlines()) > LARGEST_MODULE and not path.name.startswith("modeling_"):
            too_large.append((name, len(text.splitlines())))
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                first = node.body[0]
                if isinstance(first, ast.Expr) and isinstance(getattr(first, "value", None), ast.Constant):
                    lines -= first.end_lineno - first.lineno + 1  # the docstring
                if lines > LONGEST_FUNCTION:
                    too_long.append((f"{name}.{node.name}", lines))
    assert not too_long, too_long
    assert not too_large, too_large


def test_the_layout_map_names_every_module_and_every_room_says_what_it_holds():
    layout = (ROOT / "docs" / "layout.md").read_text(encoding="utf-8")
    for name, path in modules().items():
        if path.name != "__init__.py":
            assert path.name in layout, f"docs/layout.md does not name {path.relative_to(ROOT)}"
        else:
            assert ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"))), f"{name} has no docstring"


def room_order() -> list[str]:
    """The rooms in the order docs/layout.md gives (`room order: model, configs, ...`)."""
    layout = (ROOT / "docs" / "layout.md").read_text(encoding="utf-8")
    line = next(line for line in layout.splitlines() if line.startswith("room order:"))
    return [room.strip() for room in line.removeprefix("room order:").split(",")]


def room(name: str) -> str | None:
    """The room of module `name` (None for the package's own top-level modules)."""
    parts = name.split(".")
    return parts[1] if len(parts) > 2 or (len(parts) == 2 and (PACKAGE / parts[1]).is_dir()) else None


def test_every_room_imports_only_the_rooms_before_it_in_the_layout_map():
    order = room_order()
    files = modules()
    rooms = {room(name) for name in files} - {None}
    assert rooms == set(order), f"docs/layout.md's room order {order} against the rooms {sorted(rooms)}"
    wrong = []
    for name, path in files.items():
        mine = room(name)
        for target in imported_modules(name, path, set(files)):
            theirs = room(target)
            if mine and theirs and theirs != mine and order.index(theirs) > order.index(mine):
                wrong.append(f"{name} imports {target}")
    assert not wrong, wrong


def test_the_top_level_model_card_is_the_template_training_fills_in():
    from hf_vanilla_transformer.sharing.model_card import TEMPLATE

    assert (ROOT / "model_card.md").resolve() == TEMPLATE.resolve()
