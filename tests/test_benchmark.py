"""The benchmark compares like with like: Marian, configured and loaded as the benchmark pairs it, computes our
function (same logits, same loss, same tokens); the benchmark runs every case and reports its ratios (no timing
asserts)."""

from __future__ import annotations

import json

import pytest
import torch

from hf_vanilla_transformer.benchmarks.config import BenchmarkConfig
from hf_vanilla_transformer.benchmarks.speed import compiles, run_benchmark, speed_table, token_agreement
from hf_vanilla_transformer.benchmarks.twins import (
    build_models,
    generation_inputs,
    make_generate,
    make_matrix_products,
    training_batch,
)

from conftest import run_script


def test_marian_with_our_weights_computes_our_logits_loss_and_tokens():
    """Our model with `sinusoid_layout="concat"` and MarianMTModel with a copy of its weights: the same logits
    (1e-5) on a padded batch, the same loss from them, the same greedy and beam tokens. The two differ only where
    no output can see it: Marian tabulates its sinusoids (ours computes them) and adds a zero output bias."""
    options = BenchmarkConfig(sizes=("toy",), vocab_size=99, dropout=0.0, batch_tokens=200)
    models = build_models("toy", options)
    ours, marian = models["ours"].eval(), models["marian"].eval()
    assert marian.model.shared.weight.data_ptr() == marian.lm_head.weight.data_ptr()
    assert torch.equal(marian.model.shared.weight, ours.model.shared.weight)
    inputs = training_batch(ours.config, options)
    assert (inputs["attention_mask"] == 0).any() and (inputs["labels"] == -100).any()  # padding on both sides
    no_labels = {key: value for key, value in inputs.items() if key != "labels"}
    with torch.no_grad():
        expected = ours(**no_labels).logits
        logits = marian(**no_labels).logits
    real = inputs["labels"] != -100
    torch.testing.assert_close(logits[real], expected[real], rtol=1e-5, atol=1e-5)
    assert expected.abs().max() > 0.1  # not a vacuous comparison of near-zero outputs
    sources = {"input_ids": inputs["input_ids"][:4], "attention_mask": inputs["attention_mask"][:4]}
    for beams in (1, 4):
        kwargs = (
            dict(num_beams=beams, max_new_tokens=8, length_penalty_type="hf")
            if beams > 1
            else dict(num_beams=1, max_new_tokens=8)
        )
        theirs = dict(kwargs)
        theirs.pop("length_penalty_type", None)
        assert torch.equal(
            ours.generate(**sources, **kwargs), marian.generate(**sources, **theirs, early_stopping=True)
        )


@pytest.mark.slow
def test_benchmark_reports_every_case_and_ratio(tmp_path):
    output = tmp_path / "benchmark.json"
    result = run_script(
        "benchmark.py",
        *("--sizes", "toy", "--vocab_size", "99", "--repeats", "1", "--warmup", "1", "--new_tokens", "4"),
        *("--batch_tokens", "200", "--json", output),
    )
    assert result.returncode == 0, result.stderr[-3000:]
    figures = json.loads(output.read_text())["sizes"]["toy"]
    assert set(figures["ratios"]) == {"train_labels", "train_logits", "greedy", "beam4", "peak_memory"}
    for case in ("train_labels", "greedy", "beam4"):
        floor = {"matrix_products"} if case != "train_labels" else set()
        assert set(figures["ratios"][case]) == {"ours", "ours_compiled", "marian_compiled"} | floor
    assert set(figures["ratios"]["train_logits"]) == {"ours"}
    assert all(value > 0 for ratios in figures["ratios"].values() for value in ratios.values())
    assert 0 < figures["cases"]["train_labels"]["ours"]["mfu"] < 1
    # Each compiled decoding pays its compile at its first call: greedy search's step, and beam search's own (the
    # model's `_beam_search`; its step runs on sentences x beams rows: 7.0 s against greedy's 1.1 s on a 2-core Zen 4).
    for case in ("greedy", "beam4"):
        assert figures["cases"][case]["ours_compiled"]["compile_warmup_seconds"] > 0.1, case
    assert "| toy | train_labels |" in result.stdout


@pytest.mark.slow  # bf16 on a CPU without bf16 units is emulated: 37 s on a Zen 3
def test_in_bf16_the_tokens_are_compared_in_fp32_and_each_variants_share_is_recorded():
    """Two correct implementations round differently in bf16, and one different token changes the rest: the
    benchmark then records each variant's share of ours' tokens (the table says it) and checks the parity in fp32,
    where any difference is an error."""
    ours = torch.tensor([[1, 2, 3, 4]])
    outputs = {"ours": ours, "marian": torch.tensor([[1, 2, 9, 9]]), "matrix_products": None}
    bf16 = BenchmarkConfig(sizes=("toy",), dtype="bf16")
    assert token_agreement("toy", "greedy", outputs, bf16) == {"ours": 1.0, "marian": 0.5}
    with pytest.raises(RuntimeError, match="toy greedy: marian generated other tokens than ours eager"):
        token_agreement("toy", "greedy", outputs, BenchmarkConfig(sizes=("toy",)))
    options = BenchmarkConfig(
        sizes=["toy"],
        dtype="bf16",
        vocab_size=99,
        repeats=1,
        warmup=1,
        new_tokens=4,
        batch_tokens=200,
        compile=False,
        memory=False,
    )
    results = run_benchmark(options)
    figures = results["sizes"]["toy"]["cases"]
    for case in ("greedy", "beam4"):
        assert 0 <= figures[case]["marian"]["tokens_equal_to_ours"] <= 1
        assert figures[case]["ours"]["tokens_equal_to_ours"] == 1.0
    assert "| toy | greedy |" in speed_table(results)


def test_the_benchmark_times_only_the_cases_and_variants_asked_for():
    """The GPU check times what its table reads (its nine minutes): training with labels and both decodings, ours
    compiled beside Marian eager; a case or precision the benchmark does not have is named."""
    options = BenchmarkConfig(
        sizes=["toy"], vocab_size=99, repeats=1, warmup=1, new_tokens=3, batch_tokens=200, compile=False, memory=False
    )
    options.cases, options.matrix_products = ["greedy"], False
    figures = run_benchmark(options)["sizes"]["toy"]["cases"]
    assert list(figures) == ["greedy"] and set(figures["greedy"]) == {"ours", "marian"}
    with pytest.raises(ValueError, match=r"cases=\['beam8'\] is invalid; expected some of"):
        BenchmarkConfig(cases=["beam8"])
    with pytest.raises(ValueError, match="dtype='tf32' is a CUDA precision; device='cpu'"):
        BenchmarkConfig(dtype="tf32")
    assert compiles("ours", BenchmarkConfig(compile_peers=False)) and not compiles(
        "marian", BenchmarkConfig(compile_peers=False)
    )
    assert compiles("marian", BenchmarkConfig()) and not compiles("ours", BenchmarkConfig(compile=False))


class LinearShapes(torch.overrides.TorchFunctionMode):
    """Records (rows, out_features, in_features, the weight's storage) of every `F.linear` call made while it is active."""

    def __init__(self):
        super().__init__()
        self.calls = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func is torch.nn.functional.linear:
            weight = args[1] if len(args) > 1 else kwargs["weight"]
            self.calls.append((args[0].numel() // args[0].shape[-1], *weight.shape, weight.data_ptr()))
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("beams", [1, 4])
def test_matrix_products_floor_runs_exactly_the_products_of_generate(beams):
    """The benchmark's `matrix_products` ceiling is only meaningful if it computes what generate() computes: the
    same matrix products, on the same number of rows, with the same weights, and nothing else."""
    options = BenchmarkConfig(sizes=("toy",), vocab_size=99, dropout=0.0, new_tokens=5, generation_batch=3)
    ours = build_models("toy", options)["ours"].eval()
    inputs = generation_inputs(options)
    with LinearShapes() as in_generate:
        make_generate(ours, inputs, beams, False, options)()
    with LinearShapes() as in_floor:
        make_matrix_products(ours, inputs, beams, options)()
    assert len(in_generate.calls) > 5 * ours.config.decoder_layers * 8  # not a vacuous comparison
    assert sorted(in_floor.calls) == sorted(in_generate.calls)


def test_the_data_memory_of_a_launch_counts_each_process_data_stages_and_the_shared_pages_once():
    """The scale table's launch line: a process's data memory is what its data stages added to its own memory
    (not the model's stage) and its share of the Arrow pages; two processes mapping the same pages share them."""
    from hf_vanilla_transformer.benchmarks.scale import data_memory, launch_memory

    mb = 2**20

    def setup(arrow_pss: int) -> dict:  # 20 MB added by the corpus, 500 by the model, 20 by the batches
        after = {
            "corpus": 320,
            "tokenizer": 320,
            "tokenize": 320,
            "model": 820,
            "lengths and batches": 840,
            "plan": 840,
        }
        stages = {name: {"anon_rss_bytes": value * mb} for name, value in after.items()}
        stages["plan"].update(arrow_pss_bytes=arrow_pss * mb, pss_bytes=(840 + arrow_pss) * mb)
        return {"at_start": {"anon_rss_bytes": 300 * mb}, "stages": stages}

    one, pair = setup(arrow_pss=60), [setup(arrow_pss=30), setup(arrow_pss=30)]  # the same 60 MB of pages, shared
    assert data_memory([one]) == ([40 * mb], 60 * mb) and data_memory(pair) == ([40 * mb, 40 * mb], 60 * mb)
    line = launch_memory(pair, one)
    assert "0.06 GB together, 1.00x the one process's 0.06 GB" in line and "0.04 and 0.04 GB, against 0.04 GB" in line


@pytest.mark.slow
def test_the_scale_benchmark_prepares_a_corpus_once_and_reads_it_back(tmp_path):
    """The scale benchmark end to end on a small synthetic corpus: a cold run that reads, learns the BPE and
    tokenizes, a warm run that reads all of it from the cache, the batch sampler alone, and the table."""
    from hf_vanilla_transformer.benchmarks.scale import ScaleBenchmarkConfig, run_scale_benchmark, scale_table

    options = ScaleBenchmarkConfig(
        pairs=[3000],
        work_dir=str(tmp_path),
        preset="tiny",
        vocab_size=500,
        max_steps=2,
        launch=False,
        batch_pairs=50_000,
        held_out_pairs=20,
    )
    results = run_scale_benchmark(options)
    assert len((tmp_path / "corpora" / "train-3000.tsv").read_text(encoding="utf-8").splitlines()) == 3000
    runs = results["corpora"]["3000"]
    (cold,), (warm,) = runs["cold"]["processes"], runs["warm"]["processes"]
    assert cold["stages"]["tokenize"]["tokenized_here"] and not warm["stages"]["tokenize"]["tokenized_here"]
    assert cold["stages"]["tokenize"]["pairs"] == warm["stages"]["tokenize"]["pairs"] > 2900
    for setup in (cold, warm):
        assert setup["stages"]["first update"]["since_start_seconds"] > 0
        assert all(stage.get("peak_rss_bytes", 0) > 0 for stage in setup["stages"].values())
        first = setup["stages"]["first update"]
        assert (
            0 < first["anon_rss_bytes"] < first["anon_rss_bytes"] + first["file_rss_bytes"] <= first["peak_rss_bytes"]
        )
        # The batches' rows are unmapped once read (`PageReleasingCollator`): no Arrow page is mapped then.
        assert first["arrow_pss_bytes"] == first["arrow_rss_bytes"] == 0 < first["file_rss_bytes"]
    assert results["batches"]["pairs"] == 50_000 and results["batches"]["batches"] > 0
    table = scale_table(results)
    assert "| 3,000 | cold |" in table and "| 3,000 | warm |" in table and "Batches of 50,000 pairs" in table
