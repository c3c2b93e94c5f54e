"""The probes behind docs/cpu_recipe.md's and docs/budget_curve.md's measurements, run on the tiny trained folder or
the 200-pair fixture and pointed at its own held-out pairs. The BLEU probes (`scripts/averaging_probe.py`,
`scripts/length_penalty_probe.py`): where a probe decodes what the run decoded, it gives the run's own figures (the
averaged model's test BLEU and chrF, the validation BLEU of each α the run tried), an average of one checkpoint scores
as that checkpoint, and the folder is left as it was. The timing probes (`scripts/beam_cost_probe.py`,
`scripts/update_speed_probe.py`): what they time and decode is what they were asked (their figures are timings, not
asserted). The averaging probe went two days broken before anyone ran it (issue 63): these run the probes every time.
`scripts/trial_batches_probe.py` reads the main job's corpus and is not run here."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from hf_vanilla_transformer.training.averaging import checkpoint_folders
from hf_vanilla_transformer.training.checkpoints import checkpoint_step

from conftest import FIXTURES, run_script


HELD_OUT = FIXTURES / "libreoffice_help_en_de_test_40.tsv"  # the tiny run's validation and test pairs


def digests(folder: Path) -> dict[str, str]:
    return {
        str(path.relative_to(folder)): hashlib.sha256(path.read_bytes()).hexdigest()
        for path in sorted(folder.rglob("*"))
        if path.is_file()
    }


def run_test_scores(results: dict) -> tuple[float, float]:
    """The run's own test BLEU and chrF (its results.json) as a probe rounds them."""
    return round(results["test"]["bleu"], 2), round(results["test"]["chrf"], 2)


def probe_rows(script: str, *args) -> list[dict]:
    result = run_script(script, *args)
    assert result.returncode == 0, result.stderr[-3000:]
    return [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]


def test_the_averaging_probe_gives_the_runs_own_average_and_leaves_the_folder_as_it_was(trained_folder):
    folder, _ = trained_folder
    results = json.loads((folder / "results.json").read_text())
    kept = checkpoint_folders(folder)
    averaged = results["averaged_checkpoints"]
    assert 2 <= len(averaged) <= len(kept) and [path.name for path in kept[-len(averaged) :]] == averaged
    before = digests(folder)
    beams = str(results["test"]["beams"])
    split_flags = ("--validation_files", HELD_OUT, "--test_files", HELD_OUT, "--beams", beams)
    rows = probe_rows("averaging_probe.py", folder, "--last", f"1,{len(averaged)},{len(kept) + 1}", *split_flags)
    by_last = {row["last"]: row for row in rows}
    assert set(by_last) == {1, len(averaged), len(kept) + 1}
    assert by_last[len(averaged)]["steps"] == [checkpoint_step(path) for path in kept[-len(averaged) :]]
    averaged_row = by_last[len(averaged)]
    assert (averaged_row["test_bleu"], averaged_row["test_chrf"]) == run_test_scores(results)  # its average again
    assert by_last[len(kept) + 1] == {"folder": str(folder), "last": len(kept) + 1, "skipped": f"{len(kept)} kept"}
    # An average of the last checkpoint alone scores as that checkpoint decoded by the α probe.
    alpha = results["test"]["length_penalty"]
    (alone,) = probe_rows("length_penalty_probe.py", kept[-1], "--alphas", str(alpha), *split_flags)
    assert by_last[1]["steps"] == [checkpoint_step(kept[-1])] and by_last[1]["alpha"] == alpha
    scores = ("validation_bleu", "validation_chrf", "test_bleu", "test_chrf")
    assert [by_last[1][score] for score in scores] == [alone[score] for score in scores]
    # --last chose what was averaged: one checkpoint and the average of several translate differently (chrF to two
    # decimals on 40 sentences; equal only if every translation were the same)
    assert by_last[1]["test_chrf"] != by_last[len(averaged)]["test_chrf"]
    assert digests(folder) == before


def test_the_length_penalty_probe_gives_the_runs_own_choice_and_test_score(trained_folder, tmp_path):
    folder, _ = trained_folder
    results = json.loads((folder / "results.json").read_text())
    choice = results["length_penalty_choice"]
    validation = tmp_path / "validation.tsv"  # the pairs the run chose α on: the first `validation_pairs`
    validation.write_text("".join(HELD_OUT.read_text().splitlines(keepends=True)[: choice["validation_pairs"]]))
    alphas = list(choice["validation_bleu"])
    rows = probe_rows(
        "length_penalty_probe.py", folder, "--alphas", ",".join(alphas), "--beams", str(choice["beams"]),
        "--validation_files", validation, "--test_files", HELD_OUT,
    )  # fmt: skip
    assert [row["alpha"] for row in rows] == [float(alpha) for alpha in alphas]
    for row, alpha in zip(rows, alphas, strict=True):
        assert row["validation_bleu"] == round(choice["validation_bleu"][alpha], 2), alpha
    chosen = next(row for row in rows if row["alpha"] == results["test"]["length_penalty"])
    assert results["test"]["beams"] == choice["beams"]
    assert (chosen["test_bleu"], chosen["test_chrf"]) == run_test_scores(results)


@pytest.mark.parametrize("script", ["averaging_probe.py", "length_penalty_probe.py"])
def test_a_probe_given_one_held_out_file_of_two_names_both(script, trained_folder):
    folder, _ = trained_folder
    result = run_script(script, folder, "--test_files", HELD_OUT)
    assert result.returncode != 0
    assert f"--validation_files None and --test_files '{HELD_OUT}': expected both files or neither" in result.stderr


@pytest.mark.slow  # 18 s: two decodings of the test pairs and four timed ones
def test_the_beam_cost_probe_decodes_the_given_pairs_at_the_runs_beam_and_reads_its_own_figures(
    trained_folder, tmp_path
):
    """`scripts/beam_cost_probe.py` (docs/budget_curve.md's beam cost): the run's beam and precision unless one is
    given, a step's latency on the trained model and a fresh one of its size, the given test pairs decoded both ways;
    the run's own re-predicted decoding only where its plan predicted one (a run of given length predicts none)."""
    folder, _ = trained_folder
    results = json.loads((folder / "results.json").read_text())
    output = tmp_path / "beam_cost.json"
    result = run_script("beam_cost_probe.py", folder, output, "bf16", "--test_files", HELD_OUT)
    assert result.returncode == 0, result.stderr[-3000:]
    found = json.loads(output.read_text())
    assert (found["beams"], found["precision"]) == (results["test"]["beams"], "bf16")  # the run's beam; bf16 as asked
    assert found["median_batch"][0] <= 40 and found["test"]["sentences"] == 40
    for model in ("trained", "fresh"):
        steps = found[f"steps_{model}"]
        assert steps["beam_step"] > 0 and steps["greedy_step"] > 0
        assert steps["ratio"] == pytest.approx(steps["beam_step"] / steps["greedy_step"])
    assert found["test"]["ratio"] == pytest.approx(found["test"]["beam"] / found["test"]["greedy"])
    assert results["plan"]["predicted_decode_seconds"] is None and "run" not in found
    refused = run_script("beam_cost_probe.py", folder, output, "fp16")
    assert refused.returncode != 0 and "invalid choice: 'fp16'" in refused.stderr


@pytest.mark.slow  # two short training runs in processes of their own
def test_the_update_speed_probe_times_the_updates_asked_and_padding_changes_shapes_not_tokens(tmp_path):
    """`scripts/update_speed_probe.py` (docs/cpu_recipe.md's batch shapes and primitive cache) on the 200-pair
    fixture, its flags over the main job's: updates 2 to 6 timed, with the lengths padded to 1 and to 8: the same
    batches (the same target tokens trained on), no more distinct shapes padded to 8."""
    data = ["--data_files", FIXTURES / "libreoffice_help_en_de_200.tsv", "--vocab_size", "500", "--preset", "tiny"]
    data += ["--validation_files", HELD_OUT, "--test_files", HELD_OUT, "--precision", "fp32"]
    figures = {}
    for multiple in (1, 8):
        command = [str(multiple), "6", "2", *data, "--output_dir", tmp_path / f"padded-{multiple}"]
        result = run_script("update_speed_probe.py", *command)
        assert result.returncode == 0, result.stderr[-3000:]
        (figures[multiple],) = [json.loads(line) for line in result.stdout.splitlines() if line.startswith('{"')]
        assert figures[multiple]["updates"] == [2, 6] and figures[multiple]["seconds_per_update"] > 0
        assert figures[multiple]["multiple"] == multiple and "--preset" in figures[multiple]["flags"]
    assert figures[1]["tokens"] == figures[8]["tokens"] > 0
    assert 1 <= figures[8]["shapes_in_epoch"] <= figures[1]["shapes_in_epoch"]  # a batch a shape, or fewer
