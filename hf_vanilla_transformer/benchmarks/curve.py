"""The recipe as a curve of minutes (`vanilla-transformer curve`): the main job (or `train` with a recipe and corpus)
at a list of budgets, each a run of its own in a folder of its own, one after another, and one table and one plot of
test BLEU against minutes.

Each point is the package's own command line (`main --max_minutes M --seed S --output_dir OUT/<M>min-seed<S>`, and
the flags the curve was given), so a point is what a user gets from the same command. A point whose folder holds
its `results.json` is done; the others run, and a point killed on the way resumes from its newest checkpoint with the
plan it had fixed (the training command's own resume): a killed curve, started again with the same command, goes
on where it stopped. A point that fails is recorded with its exit status; one whose run wrote its results (a
source collapse) is kept as a point of the curve, one that left none is run again by the next call.

`--kernels native` runs the points in this environment as it is; `--kernels avx2` caps the kernels of every point at
AVX2 (`KERNEL_ENVIRONMENT`: PyTorch's own, oneDNN's and MKL's),
as on a laptop without AVX-512 or AMX: the run then sees no bf16 units (`utils/machine.py`) and trains in fp32.
Before the first point a probe shows that the caps took effect (`kernels_check`: the ISA PyTorch dispatches to and
the one oneDNN and MKL name in their verbose output), and the curve stops where they did not.

Time nothing else on the machine while a curve runs: another process slows every point and the budget then buys
fewer updates (docs/budget_curve.md).
"""

from __future__ import annotations

import json
import math
import os
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from ..utils.machine import describe_machine
from .gpu_check_steps import run_step


# The environment of a point whose kernels are capped at AVX2 (`--kernels avx2`): the common laptop's instruction set
# for PyTorch's own kernels, oneDNN's and MKL's (docs/budget_curve.md, "Emulating an AVX2 laptop").
KERNEL_ENVIRONMENT = {
    "native": {},
    "avx2": {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2", "MKL_ENABLE_INSTRUCTIONS": "AVX2"},
}
COMMANDS = ("main", "train")
# A point may overrun its budget by its set-up's measuring, a resume, a slow decoding: stopped past this many times
# its minutes (and 15 minutes more).
TIMEOUT_FACTOR = 2.0
RESULTS = "results.json"


@dataclass(frozen=True)
class CurveOptions:
    """What to run: the budgets (`minutes`) and `seeds` of the points, the kernels, the command (`main` or `train`)
    and the flags every point gets (`extra`: a recipe, a corpus, a precision), into `output_dir`; `label` names the
    curve in the plot."""

    output_dir: str
    minutes: tuple[float, ...] = (6.0, 13.0, 26.0, 52.0, 104.0)
    seeds: tuple[int, ...] = (42,)
    kernels: str = "native"
    command: str = "main"
    extra: tuple[str, ...] = field(default=())
    label: str | None = None

    def __post_init__(self) -> None:
        if not self.minutes or any(not math.isfinite(m) or m <= 0 for m in self.minutes):
            raise ValueError(f"minutes={self.minutes} is invalid; expected budgets in minutes above 0.")
        if not self.seeds:
            raise ValueError("seeds=() is invalid; expected at least one seed.")
        if self.kernels not in KERNEL_ENVIRONMENT:
            raise ValueError(f"kernels={self.kernels!r} is invalid; expected one of {', '.join(KERNEL_ENVIRONMENT)}.")
        if self.command not in COMMANDS:
            raise ValueError(f"command={self.command!r} is invalid; expected one of {', '.join(COMMANDS)}.")
        owned = {"--max_minutes", "--seed", "--output_dir", "--max_steps", "--resume_from_checkpoint"}
        given = sorted({word.split("=", 1)[0].replace("-", "_").replace("__", "--", 1) for word in self.extra} & owned)
        if given:
            raise ValueError(
                f"{', '.join(given)} are the curve's own (each point's budget, seed and folder); remove them."
            )

    def same_curve(self) -> dict:
        """What makes two runs of the command one curve: everything but the points asked for and the label."""
        return {"kernels": self.kernels, "command": self.command, "extra": list(self.extra)}


def point_name(minutes: float, seed: int) -> str:
    """A point's folder name: `26min-seed42`."""
    return f"{minutes:g}min-seed{seed}"


def point_flags(options: CurveOptions, minutes: float, seed: int) -> list[str]:
    """The command line of a point, after `python -m hf_vanilla_transformer`."""
    folder = Path(options.output_dir) / point_name(minutes, seed)
    flags = [options.command, "--max_minutes", f"{minutes:g}", "--seed", str(seed), "--output_dir", str(folder)]
    return [*flags, "--disable_tqdm", "true", *options.extra]


def environment(kernels: str) -> dict:
    """A point's environment: this one, its kernels capped as asked, unbuffered output, nothing from the Hub."""
    return {**os.environ, **KERNEL_ENVIRONMENT[kernels], "PYTHONUNBUFFERED": "1", "HF_HUB_OFFLINE": "1"}


# The probe of `kernels_check`, run in a process of the points' environment: what PyTorch dispatches to, and the
# first lines of oneDNN's and MKL's verbose output for an fp32 product (MKL), a convolution (oneDNN) and a bf16
# product (oneDNN where it may use bf16 units).
PROBE = """
import torch
print("torch capability:", torch.backends.cpu.get_cpu_capability(), flush=True)
torch.nn.Linear(64, 64)(torch.randn(8, 64))
torch.nn.Conv2d(16, 16, 3)(torch.randn(2, 16, 32, 32))
torch.randn(8, 64, dtype=torch.bfloat16) @ torch.randn(64, 8, dtype=torch.bfloat16)
"""


def kernels_check(kernels: str) -> dict:
    """What the kernels of a point's environment run on: PyTorch's capability, the ISA oneDNN says it uses, the
    instructions MKL says it enabled, and the bf16 units the package sees; `ok` where every cap took effect."""
    import subprocess

    env = {**environment(kernels), "ONEDNN_VERBOSE": "1", "MKL_VERBOSE": "1"}
    try:
        done = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=300)
    except subprocess.TimeoutExpired:
        return {
            "kernels": kernels,
            "torch": None,
            "onednn": None,
            "mkl": None,
            "machine": "the probe timed out",
            "ok": False,
        }
    lines = (done.stdout + done.stderr).splitlines()
    torch_isa = next((line.split(":", 1)[1].strip() for line in lines if line.startswith("torch capability")), None)
    onednn = next((line.split("isa:", 1)[1].strip() for line in lines if ",info,cpu,isa:" in line), None)
    mkl = next((line.split("for Intel(R) 64 architecture", 1)[1].strip() for line in lines if line.startswith(
        "MKL_VERBOSE") and "architecture" in line), None)  # fmt: skip
    check = {"kernels": kernels, "torch": torch_isa, "onednn": onednn, "mkl": mkl, "machine": _machine(env)}
    if kernels == "avx2":
        check["ok"] = (
            torch_isa == "AVX2" and onednn is not None and "AVX2" in onednn and "512" not in onednn
            and mkl is not None and mkl_capped(mkl)
        )  # fmt: skip
    else:
        check["ok"] = torch_isa is not None
    return check


def mkl_capped(named: str) -> bool:
    """Whether MKL's verbose output (`named`: what it says it runs for) shows its products capped at AVX2. On an
    Intel CPU it names the extensions it enabled ("Intel(R) Advanced Vector Extensions 2 (Intel(R) AVX2) enabled
    processors"); on another (the AMD EPYC Zen 3 of 2026-12-02) only "Intel(R) Architecture processors", capped or
    not: there nothing beyond AVX2 may be named."""
    if "512" in named or "AMX" in named:
        return False
    return "AVX2" in named or "Extensions" not in named


def _machine(env: dict) -> str:
    """`describe_machine()` as a point's process sees it (its caps named)."""
    import subprocess

    code = "from hf_vanilla_transformer.utils.machine import describe_machine; print(describe_machine('cpu'))"
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    return done.stdout.strip() or describe_machine("cpu")


def read_curve(folder: Path) -> dict | None:
    """The curve recorded in `folder` (curve.json), or None."""
    path = folder / "curve.json"
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else None


def run_curve(options: CurveOptions, progress: bool = True) -> dict:
    """Run the points not yet done (see the module docstring), one after another; after each, the table
    (`curve.md`), the figures (`curve.json`) and the plot (`curve.png`) are written again. Returns the figures."""
    folder = Path(options.output_dir)
    folder.mkdir(parents=True, exist_ok=True)
    curve = read_curve(folder)
    if curve is not None and curve["options"] != options.same_curve():
        raise ValueError(
            f"{folder} holds a curve of other settings ({json.dumps(curve['options'])}); expected "
            f"{json.dumps(options.same_curve())}: give another --output_dir."
        )
    if curve is None:
        curve = {"options": options.same_curve(), "label": options.label, "points": {}}
    curve["label"] = options.label or curve.get("label")
    count = len(options.minutes) * len(options.seeds)
    print(
        f"A curve of {count} point{'s' if count != 1 else ''} ({', '.join(f'{m:g}' for m in options.minutes)} minutes,"
        f" seed{'s' if len(options.seeds) != 1 else ''} {', '.join(map(str, options.seeds))}) into {folder}: time "
        "nothing else on this machine "
        "meanwhile (another process slows every point, and its budget then buys fewer updates).",
        flush=True,
    )
    check = kernels_check(options.kernels)
    curve["kernels_check"] = check
    print(f"kernels: {_said_check(check)}", flush=True)
    if not check["ok"]:
        raise RuntimeError(f"the kernels were not capped as asked ({_said_check(check)}); no point was run.")
    todo = [(m, s) for m in options.minutes for s in options.seeds if not point_done(folder / point_name(m, s))]
    for minutes, seed in [(m, s) for m in options.minutes for s in options.seeds]:
        if (minutes, seed) not in todo:
            curve["points"].setdefault(point_name(minutes, seed), {"status": "ok"})
    bar = _Progress(sum(m for m, _ in todo), enabled=progress)
    try:
        for index, (minutes, seed) in enumerate(todo):
            name = point_name(minutes, seed)
            log = folder / f"{name}.log"
            resumed = any((folder / name).glob("checkpoint-*"))
            print(
                f"point {index + 1}/{len(todo)}: {minutes:g} minutes, seed {seed}{' (resumed)' if resumed else ''}; "
                f"its log: {log}",
                flush=True,
            )
            bar.start(name, minutes)
            flags = point_flags(options, minutes, seed)
            limit, env = minutes * 60 * TIMEOUT_FACTOR + 900, environment(options.kernels)
            step = run_step(_command(flags), log, limit, env, append=resumed)  # a resumed point's log goes on
            bar.done(minutes)
            curve["points"][name] = {"status": step["status"], "command": step["command"], "resumed": resumed}
            curve["points"][name]["seconds"] = step["seconds"]
            write_curve(folder, curve)
            row = point_row(folder, name, curve["points"][name])
            print(f"  {name}: {_said_row(row)}", flush=True)
    finally:
        bar.close()
    write_curve(folder, curve)
    return curve


def _command(flags: list[str]) -> list[str]:
    return [sys.executable, "-m", "hf_vanilla_transformer", *flags]


def point_done(folder: Path) -> bool:
    """Whether a point's run ended: its folder holds results.json with a test score."""
    path = folder / RESULTS
    if not path.is_file():
        return False
    try:
        return "test" in json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False


class _Progress:
    """A bar over the curve's budgeted minutes, moved by the clock while a point runs (its budget is its length)."""

    def __init__(self, total_minutes: float, enabled: bool = True):
        self.bar, self.base, self.started, self.minutes = None, 0.0, None, 0.0
        self.stop, self.thread = threading.Event(), None
        if enabled and total_minutes > 0:
            from tqdm.auto import tqdm

            self.bar = tqdm(total=round(total_minutes, 1), unit="min", desc="curve", bar_format=_BAR)
            self.every = 5.0 if sys.stderr.isatty() else 60.0  # into a log: a line a minute
            self.thread = threading.Thread(target=self._tick, daemon=True)
            self.thread.start()

    def start(self, name: str, minutes: float) -> None:
        self.started, self.minutes = time.monotonic(), minutes
        if self.bar is not None:
            self.bar.set_postfix_str(name)

    def done(self, minutes: float) -> None:
        self.base, self.started = self.base + minutes, None
        self._show(self.base)

    def _tick(self) -> None:
        while not self.stop.wait(self.every):
            if self.started is not None:
                self._show(self.base + min(self.minutes, (time.monotonic() - self.started) / 60))

    def _show(self, value: float) -> None:
        if self.bar is not None:
            self.bar.n = round(value, 1)
            self.bar.refresh()

    def close(self) -> None:
        self.stop.set()
        if self.bar is not None:
            self.bar.close()


_BAR = "{desc}: {percentage:3.0f}%|{bar}| {n:.1f}/{total:.1f} budgeted min [{elapsed}<{remaining}{postfix}]"


def _said_check(check: dict) -> str:
    return f"PyTorch {check['torch']}, oneDNN {check['onednn']}, MKL {check['mkl']}; {check['machine']}"


def point_row(folder: Path, name: str, point: dict) -> dict:
    """A point of the table from its folder's results.json (and the curve's record of its run)."""
    minutes, seed = name.split("min-seed")
    row = {"point": name, "minutes": float(minutes), "seed": int(seed), "status": point.get("status", "ok")}
    path = folder / name / RESULTS
    if not path.is_file():
        return row
    results = json.loads(path.read_text(encoding="utf-8"))
    plan, training, test = results.get("plan") or {}, results.get("training") or {}, results.get("test") or {}
    row.update(
        size=plan.get("preset") or (results.get("recipe") or {}).get("preset"),
        parameters=results.get("parameters"),
        precision=plan.get("precision") or training.get("precision"),
        updates=training.get("steps"),
        seconds_per_update=training.get("seconds_per_update"),
        epochs=training.get("epochs"),
        bleu=test.get("bleu"),
        chrf=test.get("chrf"),
        whole_minutes=(results.get("wall_seconds") or 0) / 60 or None,
        rules=fired_rules(results),
        hardware=results.get("hardware"),
        collapsed=(results.get("source_check") or {}).get("collapsed_at") is not None,
    )
    return row


def fired_rules(results: dict) -> list[str]:
    """The rules of the recipe that decided something in a run, in words: those the run recorded (`rules`), else
    what its plan shows (an epoch cap, a cut warmup, a switch, a deadline, an alpha at its grid's edge)."""
    if results.get("rules") is not None:
        return [rule["said"] for rule in results["rules"]]
    plan, said = results.get("plan") or {}, []
    reasons = " ".join(plan.get("reasons") or [])
    if "capped at" in reasons and "epochs" in reasons:
        said.append("epoch cap")
    asked = (results.get("recipe") or {}).get("warmup_steps")
    if asked and plan.get("warmup_steps") and plan["warmup_steps"] < asked:
        said.append(f"warmup cut to {plan['warmup_steps']:,}")
    if plan.get("switched_from"):
        said.append("switched")
    if plan.get("ended_by") == "deadline":
        said.append("deadline")
    choice = results.get("length_penalty_choice") or {}
    alphas = [float(alpha) for alpha in (choice.get("validation_bleu") or {})]
    if alphas and choice.get("chosen") is not None and float(choice["chosen"]) == max(alphas) and len(alphas) > 1:
        said.append(f"alpha {choice['chosen']:g} at the grid's edge")
    if (results.get("source_check") or {}).get("collapsed_at") is not None:
        said.append("collapse guard stopped it")
    return said


def _said_row(row: dict) -> str:
    if row.get("bleu") is None:
        return row["status"]
    return (
        f"{row['status']}; {row.get('size')} in {row.get('precision')}, {row.get('updates') or 0:,} updates "
        f"({row.get('epochs') or 0:.1f} epochs), test BLEU {row['bleu']:.2f}, chrF {row.get('chrf') or 0:.2f}"
    )


def curve_rows(folder: Path, curve: dict) -> list[dict]:
    """Every point of the curve in `folder`, by minutes then seed."""
    rows = [point_row(folder, name, point) for name, point in curve["points"].items()]
    return sorted(rows, key=lambda row: (row["minutes"], row["seed"]))


def render_table(rows: list[dict], curve: dict) -> str:
    """The curve as Markdown: one row per point."""
    options = curve["options"]
    flags = " ".join(options["extra"]) or "(none)"
    machine = (curve.get("kernels_check") or {}).get("machine") or next(
        (row["hardware"] for row in rows if row.get("hardware")), "?"
    )
    lines = [
        f"`vanilla-transformer curve`: `{options['command']}` at each budget, flags {flags}, kernels "
        f"{options['kernels']}; {machine}",
        "",
        "| minutes | seed | size | precision | updates | s / update | epochs | test BLEU | chrF | whole run (min) "
        "| rules that fired | status |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        if row.get("bleu") is None:
            lines.append(f"| {row['minutes']:g} | {row['seed']} |{' |' * 9} {row['status']} |")
            continue
        speed = row.get("seconds_per_update")  # the Trainer's over the run: how fast the host ran
        lines.append(
            f"| {row['minutes']:g} | {row['seed']} | {row['size']} | {row['precision']} | {row['updates']:,} | "
            f"{'' if speed is None else f'{speed:.3f}'} | {row['epochs']:.1f} | {row['bleu']:.2f} | "
            f"{row['chrf']:.2f} | {row['whole_minutes']:.1f} | {'; '.join(row['rules']) or '-'} | {row['status']} |"
        )
    return "\n".join(lines)


def curve_label(curve: dict) -> str:
    """How the plot names a curve: its label, else its kernels and precision."""
    return curve.get("label") or f"kernels {curve['options']['kernels']}"


def plot_curves(curves: list[tuple[str, list[dict]]], path: Path) -> Path:
    """Test BLEU against minutes (log scale), a line through each curve's mean at each budget and every seed's point;
    `curves` (label, rows)."""
    from ..sharing.plots import _pyplot, _save

    plt = _pyplot()
    figure, axis = plt.subplots(figsize=(6.4, 4.2), constrained_layout=True)
    ticks = set()
    for label, rows in curves:
        scored = [row for row in rows if row.get("bleu") is not None]
        if not scored:
            continue
        budgets = sorted({row["minutes"] for row in scored})
        means = [sum(r["bleu"] for r in scored if r["minutes"] == m) / sum(r["minutes"] == m for r in scored)
                 for m in budgets]  # fmt: skip
        line = axis.plot(budgets, means, marker="o", label=label)[0]
        axis.scatter([r["minutes"] for r in scored], [r["bleu"] for r in scored], s=12, color=line.get_color())
        ticks.update(budgets)
    axis.set_xscale("log")
    axis.set_xticks(sorted(ticks))
    axis.set_xticklabels([f"{tick:g}" for tick in sorted(ticks)])
    axis.minorticks_off()
    axis.set_xlabel("budget of the whole run (minutes)")
    axis.set_ylabel("test BLEU (beam 4)")
    axis.grid(alpha=0.3)
    if curves:
        axis.legend()
    return _save(figure, path)


def write_curve(folder: Path, curve: dict, also: tuple[str, ...] = ()) -> None:
    """curve.json (the record and every point's figures), curve.md (the table) and curve.png (the plot, with the
    curves of the folders `also` beside it)."""
    rows = curve_rows(folder, curve)
    (folder / "curve.json").write_text(json.dumps({**curve, "rows": rows}, indent=2) + "\n", encoding="utf-8")
    (folder / "curve.md").write_text(render_table(rows, curve) + "\n", encoding="utf-8")
    curves = [(curve_label(curve), rows)]
    for other in also:
        recorded = read_curve(Path(other))
        if recorded is None:
            raise FileNotFoundError(f"{other} holds no curve.json; expected the folder of a curve.")
        curves.append((curve_label(recorded), curve_rows(Path(other), recorded)))
    plot_curves(curves, folder / "curve.png")


def render(folder: str, also: tuple[str, ...] = (), label: str | None = None) -> dict:
    """The table and plot of the curve in `folder` written again (with the curves of `also` in the plot), running
    nothing."""
    path = Path(folder)
    curve = read_curve(path)
    if curve is None:
        raise FileNotFoundError(f"{folder} holds no curve.json; expected the folder of a curve.")
    if label:
        curve["label"] = label
    write_curve(path, curve, also)
    return {**curve, "rows": curve_rows(path, curve)}


__all__ = ["CurveOptions", "fired_rules", "kernels_check", "render", "run_curve"]
