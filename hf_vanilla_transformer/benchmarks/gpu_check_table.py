"""The GPU check's table: each row computed from what the check's steps wrote (the gpu tests' report, the main job's
`results.json`, the speed benchmark's JSON per size), with its goal from issues 39 and 50 and a mark: pass, fail, or
n/a (no figure to judge, or a row with no goal of its own). Pure functions of those outputs; `gpu_check.py` runs the
steps.

The goals (docs/gpu.md, "The GPU check"), for the check's main job (the time its nine and a half minutes leave, about
five and a half):

* the plan costs at most 45 seconds and chooses bf16 and base or big;
* the plan's seconds per update within 10% of the Trainer's measured ones, over at least 200 updates;
* the main job's training tokens/s at least 80% of the benchmark's training step of the same model, batch and dtype;
* compiled greedy and beam-4 decoding at least 2x MarianMTModel eager; compiled training at least 1.3x (base; the
  main job's size measured eager where it is another);
* the source check's last gain at least its own threshold (0.1 nats per token), where that validation came after
  the warmup (as the check itself judges);
* test BLEU at least 40 on the help corpus's test split.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..model.configuration_vanilla_transformer import PRESETS
from .config import SIZES


PASS, FAIL, NOT_JUDGED = "pass", "fail", "n/a"

CHOSEN_PRECISION = "bf16"
CHOSEN_PRESETS = ("base", "big")
PLAN_SECONDS = 45.0  # the main job's plan (calibration, the Trainer's trial) at most
PLAN_TOLERANCE = 0.10  # |planned / measured - 1|
PLAN_UPDATES = 200  # ... over at least this many of the Trainer's updates
TRAINER_SHARE = 0.80  # the main job's training tokens/s over the benchmark's step
DECODING_OVER_MARIAN = 2.0  # compiled greedy and beam-4 over MarianMTModel eager
TRAINING_OVER_MARIAN = 1.3  # compiled training over MarianMTModel eager
MARIAN_GOALS = f"compiled >= {DECODING_OVER_MARIAN:g}x decoding, {TRAINING_OVER_MARIAN:g}x training"
BLEU_GOAL = 40.0  # the check's main job on the help corpus's test split
TESTS_CHECK = 'gpu tests (pytest -m "gpu and not slow")'


@dataclass(frozen=True)
class Row:
    """One line of the table: what is checked, what it reads, its goal, its mark, and the figures it was computed
    from (for the JSON)."""

    check: str
    reads: str
    goal: str
    mark: str
    figures: dict = field(default_factory=dict)


@dataclass(frozen=True)
class CheckOutputs:
    """What the steps left: the gpu tests' counts; the main job's results.json (None: `results_missing` says why);
    the benchmark's JSON per size measured (a size not measured: `benchmark_missing` says why)."""

    tests: dict
    results: dict | None
    results_missing: str = ""
    benchmarks: dict[str, dict] = field(default_factory=dict)
    benchmark_missing: dict[str, str] = field(default_factory=dict)


def benchmark_size(preset: str | None) -> str | None:
    """The benchmark's size with the architecture of the package's `preset` (the benchmark's "toy" is the "tiny"
    preset; its "tiny" is another model), or None."""
    if preset not in PRESETS:
        return None
    shape = _architecture(PRESETS[preset])
    return next((size for size, spec in SIZES.items() if _architecture(spec) == shape), None)


def _architecture(spec: dict) -> dict:
    return {key: value for key, value in spec.items() if key not in ("dropout", "vocab_size")}


def judged(ok: bool) -> str:
    return PASS if ok else FAIL


# ---------------------------------------------------------------------------------------------------------------------
# The rows
# ---------------------------------------------------------------------------------------------------------------------


def gpu_tests_row(tests: dict) -> Row:
    """The `gpu` tests: fail where one failed, errored or the run timed out; pass where some passed; else n/a (all
    skipped, as on a CPU, or not run)."""
    goal = "all pass on a GPU"
    if tests.get("status", "").startswith("not run"):
        return Row(TESTS_CHECK, tests["status"], goal, NOT_JUDGED)
    counts = {key: tests.get(key, 0) for key in ("passed", "failed", "errors", "skipped")}
    reads = ", ".join(f"{value} {key}" for key, value in counts.items())
    reasons = "; ".join(tests.get("skip_reasons", []))
    reads += f" (skipped: {reasons})" if reasons and counts["skipped"] else ""
    if tests.get("timed_out"):
        reads = f"timed out after {tests['limit_seconds']:g} s: {reads} by then"
    elif tests.get("stopped_exiting"):
        reads += " (pytest stopped at the limit while exiting, after its summary)"
    if counts["failed"] or counts["errors"] or tests.get("timed_out"):
        mark = FAIL
    else:
        mark = PASS if counts["passed"] else NOT_JUDGED
    return Row(TESTS_CHECK, reads, goal, mark, counts)


def choice_row(results: dict | None, missing: str) -> Row:
    goal = f"{CHOSEN_PRECISION}, {' or '.join(CHOSEN_PRESETS)}"
    if results is None:
        return Row("main job: size, precision, attention, batch", f"n/a: {missing}", goal, NOT_JUDGED)
    plan = results["plan"]
    figures = {key: plan.get(key) for key in ("preset", "precision", "attn_implementation", "max_tokens")}
    figures["gradient_accumulation_steps"] = plan.get("gradient_accumulation_steps") or 1
    reads = (
        f"{figures['preset']}, {figures['precision']}, {figures['attn_implementation']}, "
        f"{figures['max_tokens']:,} tokens x {figures['gradient_accumulation_steps']} per update"
    )
    if plan.get("max_minutes"):
        reads += f" in {run_length(plan['max_minutes'])}"
    ok = figures["precision"] == CHOSEN_PRECISION and figures["preset"] in CHOSEN_PRESETS
    return Row("main job: size, precision, attention, batch", reads, goal, judged(ok), figures)


def plan_cost_row(results: dict | None, missing: str) -> Row:
    """The plan's own seconds (the calibration of every choice, the decoding steps, the Trainer's trial), as the run
    recorded its set-up stage."""
    check, goal = "main job: the plan's seconds", f"<= {PLAN_SECONDS:g} s"
    if results is None:
        return Row(check, f"n/a: {missing}", goal, NOT_JUDGED)
    seconds = ((results.get("setup") or {}).get("plan") or {}).get("seconds")
    if seconds is None:
        return Row(check, "n/a: results.json has no plan stage", goal, NOT_JUDGED)
    reads = f"{seconds:.1f} s"
    return Row(check, reads, goal, judged(seconds <= PLAN_SECONDS), {"seconds": seconds})


def update_time_row(results: dict | None, missing: str) -> Row:
    """The plan's seconds per update (new shapes paid) against the Trainer's measured ones, over enough updates."""
    check, goal = "seconds per update: planned / measured", f"within {PLAN_TOLERANCE:.0%} over {PLAN_UPDATES}+ updates"
    if results is None:
        return Row(check, f"n/a: {missing}", goal, NOT_JUDGED)
    plan = results["plan"]
    planned = plan.get("predicted_seconds_per_update") or plan.get("seconds_per_update")
    measured = plan.get("measured_seconds_per_update")
    if not planned or not measured:
        return Row(check, f"n/a: results.json has planned {planned} and measured {measured}", goal, NOT_JUDGED)
    ratio = planned / measured
    updates = (results.get("training") or {}).get("steps")
    figures = {"planned": planned, "measured": measured, "ratio": ratio, "updates": updates}
    reads = f"{planned:.4f} / {measured:.4f} s = {ratio:.2f}"
    enough = updates is None or updates >= PLAN_UPDATES  # (older results.json: the count not recorded)
    if updates is not None:
        reads += f" over {updates:,} updates" + ("" if enough else f" (fewer than {PLAN_UPDATES})")
    return Row(check, reads, goal, judged(abs(ratio - 1) <= PLAN_TOLERANCE and enough), figures)


def training_speed_row(outputs: CheckOutputs) -> Row:
    """The main job's training target tokens/s against the benchmark's train_labels step of the same size, batch
    and dtype (its compiled step where the main job compiled its own)."""
    check, goal = "training tokens/s: main job / benchmark", f">= {TRAINER_SHARE:.2f}"
    results = outputs.results
    if results is None:
        return Row(check, f"n/a: {outputs.results_missing}", goal, NOT_JUDGED)
    plan, trained = results["plan"], results["training"].get("target_tokens_per_second")
    size = benchmark_size(plan.get("preset"))
    benchmark = outputs.benchmarks.get(size)
    if benchmark is None:
        why = outputs.benchmark_missing.get(size, f"the benchmark measured {', '.join(outputs.benchmarks) or 'none'}")
        return Row(check, f"n/a: no benchmark of {plan.get('preset')} ({why})", goal, NOT_JUDGED)
    differs = _differences(results, benchmark["options"])
    if differs or not trained:
        why = f"the benchmark's {differs}" if differs else "results.json has no training tokens/s"
        return Row(check, f"n/a: {why}", goal, NOT_JUDGED)
    variant = "ours_compiled" if plan.get("torch_compile") else "ours"
    step = benchmark["sizes"][size]["cases"]["train_labels"].get(variant)
    if step is None:
        return Row(check, f"n/a: the benchmark has no {variant} training step", goal, NOT_JUDGED)
    ratio = trained / step["tokens_per_second"]
    figures = {"main_job": trained, "benchmark": step["tokens_per_second"], "variant": variant, "ratio": ratio}
    reads = f"{trained:,.0f} / {step['tokens_per_second']:,.0f} ({size}, {variant}) = {ratio:.2f}"
    return Row(check, reads, goal, judged(ratio >= TRAINER_SHARE), figures)


def _differences(results: dict, options: dict) -> str:
    """What makes the benchmark's step another one than the main job's: its dtype, batch or vocabulary."""
    pairs = {
        "dtype": (options["dtype"], results["plan"].get("precision")),
        "batch_tokens": (options["batch_tokens"], results["plan"].get("max_tokens")),
        "vocab_size": (options["vocab_size"], results["model"].get("vocab_size")),
    }
    return ", ".join(
        f"{name} {ours} against the main job's {theirs}" for name, (ours, theirs) in pairs.items() if ours != theirs
    )


def marian_rows(size: str, benchmark: dict) -> list[Row]:
    """Training, greedy and beam-4 of `size` against MarianMTModel eager: the compiled ratio judged, eager said."""
    figures = benchmark["sizes"][size]
    rows = []
    for case, what, goal in (
        ("train_labels", "training", TRAINING_OVER_MARIAN),
        ("greedy", "greedy decoding", DECODING_OVER_MARIAN),
        ("beam4", "beam-4 decoding", DECODING_OVER_MARIAN),
    ):
        variants, ratios = figures["cases"][case], figures["ratios"][case]
        marian = variants["marian"]["tokens_per_second"]
        said = [
            f"{label} {variants[name]['tokens_per_second']:,.0f} tok/s = {ratios[name]:.2f}x"
            for name, label in (("ours_compiled", "compiled"), ("ours", "eager"))
            if name in ratios
        ]
        reads = f"{', '.join(said)}; Marian eager {marian:,.0f}"
        compiled = ratios.get("ours_compiled")
        if compiled is None:
            reads += " (compiled not measured)"
        row_figures = {"compiled": compiled, "eager": ratios.get("ours"), "marian_tokens_per_second": marian}
        mark = NOT_JUDGED if compiled is None else judged(compiled >= goal)
        rows.append(Row(f"{size} {what} / Marian eager", reads, f"compiled >= {goal:g}x", mark, row_figures))
    return rows


def source_gain_row(results: dict | None, missing: str) -> Row:
    """The source check's last gain (validation loss with shuffled sources minus with the real ones), against the
    check's own threshold as results.json records it."""
    check = "source gain (nats per token)"
    if results is None:
        return Row(check, f"n/a: {missing}", "at least the source check's threshold", NOT_JUDGED)
    record = results.get("source_check") or {}
    history, threshold = record.get("history") or [], record.get("gain_at_least")
    goal = f">= {threshold:g} at the last validation" if threshold is not None else "at least the check's threshold"
    if not history or threshold is None:
        return Row(check, "n/a: the run recorded no source check", goal, NOT_JUDGED)
    gains = [entry["source_gain"] for entry in history]
    last = history[-1]
    reads = (
        f"{gains[-1]:.3f} at update {last['step']:,} ({len(gains)} validations: {', '.join(f'{g:.3f}' for g in gains)})"
    )
    figures = {"gains": gains, "last": gains[-1], "threshold": threshold}
    warmup = (results.get("plan") or {}).get("warmup_steps") or 0
    if last["step"] <= warmup:  # the source check itself judges only after the warmup
        return Row(check, f"{reads}; before the warmup's end ({warmup:,}): not judged", goal, NOT_JUDGED, figures)
    return Row(check, reads, goal, judged(gains[-1] >= threshold), figures)


def bleu_row(results: dict | None, missing: str) -> Row:
    """Test BLEU against the goal, the run's length said beside it."""
    goal = f">= {BLEU_GOAL:g}"
    if results is None:
        return Row("test BLEU", f"n/a: {missing}", goal, NOT_JUDGED)
    bleu, minutes = results["test"]["bleu"], results["plan"].get("max_minutes")
    figures = {"bleu": bleu, "max_minutes": minutes}
    return Row("test BLEU", f"{bleu:.2f} after {run_length(minutes)}", goal, judged(bleu >= BLEU_GOAL), figures)


def run_length(minutes: float | None) -> str:
    return f"a {minutes:g}-minute run" if minutes else "a run of a given length"


def check_rows(outputs: CheckOutputs) -> list[Row]:
    """The table, top to bottom."""
    results, missing = outputs.results, outputs.results_missing
    rows = [gpu_tests_row(outputs.tests), choice_row(results, missing), plan_cost_row(results, missing)]
    rows.append(update_time_row(results, missing))
    rows.append(training_speed_row(outputs))
    for size, benchmark in outputs.benchmarks.items():
        rows += marian_rows(size, benchmark)
    for size, why in outputs.benchmark_missing.items():
        rows.append(Row(f"{size} against Marian eager", f"n/a: {why}", MARIAN_GOALS, NOT_JUDGED))
    return [*rows, source_gain_row(results, missing), bleu_row(results, missing)]


def render_table(rows: list[Row]) -> str:
    """The rows as a Markdown table."""
    lines = ["| check | reads | goal | mark |", "|---|---|---|---|"]
    lines += [f"| {row.check} | {row.reads} | {row.goal} | {row.mark} |" for row in rows]
    return "\n".join(lines)
