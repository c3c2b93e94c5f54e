"""What a beam-4 sentence costs against a greedy one on this CPU, for a finished main job's model folder, three ways
in one process (mimalloc and oneDNN's primitive cache as a run has them: `use_fast_allocator`):

    steps  a decoding step's latency with the test's beams (in fp32, as the run's test decoding) over a greedy one
           (in the run's precision, as its validations), on the test split's median batch
           (`decode_speed.measure_decode_step`, what a plan measures on a GPU), on the trained model and on a fresh
           one of the same size: what a CPU's plan could measure before training, in a few seconds (it does not:
           on the Zen 4 of 2026-12-03 this ratio was 3-7, noisy, where `run` was 2.4-2.5)
    test   the test split translated greedy (the run's precision) and with the test's beams at the run's alpha (fp32)
    run    what the run's own decoding says: its choice of alpha and test decoding (results.json), over the greedy
           sentences its plan predicted them from (the plan's prediction as training ended, after its re-plans,
           over the beam cost it counted: `costs.decode_cost`, 3 for beam 4); meaningless where no validation
           re-predicted it (a run too short to translate)

`run` is the figure a plan would have needed. The main job's folders only (the test split read again by its
corpus's name: the help's, English to German). Prints and writes (OUTPUT) one JSON object. docs/budget_curve.md
("Where the unspent minutes come from") has the figures. Run it alone on the machine:

    python scripts/beam_cost_probe.py RUN_FOLDER OUTPUT.json [PRECISION] [--test_files PAIRS]

PRECISION (fp32, bf16) replaces the run's for the greedy decoding: with `fp32` under the caps of an AVX2 laptop
(`ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2`, docs/budget_curve.md) a model
trained in bf16 shows the laptop's figures; `run` is then the run's, not the laptop's. `--test_files` (TSV or JSONL)
decodes those pairs' sources instead of the run's corpus's test split (a run on local files names no corpus)."""

import argparse
import json
import time
from pathlib import Path

from hf_vanilla_transformer.utils.allocator import use_fast_allocator


use_fast_allocator()  # re-runs this process as a run runs: mimalloc preloaded, the larger primitive cache

import torch  # noqa: E402
from transformers import AutoTokenizer  # noqa: E402

import hf_vanilla_transformer  # noqa: E402, F401 (registers the classes)
from hf_vanilla_transformer import VanillaTransformerForConditionalGeneration  # noqa: E402
from hf_vanilla_transformer.data.corpora import load_corpus, read_parallel_file  # noqa: E402
from hf_vanilla_transformer.evaluation.translation import translate  # noqa: E402
from hf_vanilla_transformer.training.budget.costs import decode_cost  # noqa: E402
from hf_vanilla_transformer.training.budget.decode_speed import measure_decode_step, median_batch  # noqa: E402
from hf_vanilla_transformer.utils.device import forward_context  # noqa: E402


parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], usage=__doc__, allow_abbrev=False)
parser.add_argument("folder", type=Path)
parser.add_argument("output", type=Path)
parser.add_argument("precision", nargs="?", choices=("fp32", "bf16"))
parser.add_argument("--test_files", help="test pairs (TSV or JSONL) instead of the run's corpus's test split")
flags = parser.parse_args()
folder, output = flags.folder, flags.output
results = json.loads((folder / "results.json").read_text())
precision, beams = flags.precision or results["training"]["precision"], results["test"]["beams"]
attention = results["plan"]["attn_implementation"]
tokenizer = AutoTokenizer.from_pretrained(folder)
model = VanillaTransformerForConditionalGeneration.from_pretrained(folder).eval()
fresh = VanillaTransformerForConditionalGeneration(model.config).eval()
test = read_parallel_file(flags.test_files) if flags.test_files else load_corpus(results["data"]["dataset"])["test"]
sources = list(test["source"])
batch, _ = median_batch(tokenizer, sources, "cpu")
found = {"folder": str(folder), "precision": precision, "beams": beams, "median_batch": list(batch["input_ids"].shape)}

for name, one in (("trained", model), ("fresh", fresh)):
    began = time.perf_counter()
    step = measure_decode_step(one, batch, beams, "fp32", attention)  # the test decodes in fp32 (finishing.py) ...
    greedy = measure_decode_step(one, batch, 1, precision, attention)  # ... a validation in the run's precision
    took = time.perf_counter() - began  # what the measuring costs a plan
    found[f"steps_{name}"] = {"beam_step": step, "greedy_step": greedy, "ratio": step / greedy, "seconds": took}
    print(name, found[f"steps_{name}"], flush=True)

seconds = {}
for label, beams_of, precision_of in (("greedy", 1, precision), ("beam", beams, "fp32")):
    began = time.perf_counter()
    with forward_context(torch.device("cpu"), precision_of):  # autocast as the run's validations; none for the test
        translate(model, tokenizer, sources, progress=False, num_beams=beams_of)
    seconds[label] = time.perf_counter() - began
found["test"] = {**seconds, "sentences": len(sources), "ratio": seconds["beam"] / seconds["greedy"]}
print("test", found["test"], flush=True)


# What the run's re-plans counted a beam sentence as, in greedy ones (a CPU's plan measures none).
counted = decode_cost(beams)
decoded, predicted = results["test"]["decode_seconds"], results["plan"]["predicted_decode_seconds"]
if decoded and predicted:
    found["run"] = {
        "decoded_seconds": decoded,
        "last_predicted_seconds": predicted,
        "counted": counted,
        "ratio": counted * decoded / predicted,
    }
    print("run", found["run"], flush=True)
output.write_text(json.dumps(found, indent=1) + "\n")
