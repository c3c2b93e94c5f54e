"""What the plan's Trainer trial meets on a CPU: one copy of a model (`small` by default, fp32, the calibration's
update: forward, backward, fused AdamW) timed on the main job's 1,024-token batches of the help and UI strings,
four ways, in one process (mimalloc and oneDNN's primitive cache as a run has them: `use_fast_allocator`), in
this order:

    A  6 batches of the calibration's kind (`shape_sample` of 18, every third), each twice: the second (steady)
    B  the trial's 24 (`shape_sample`: distinct shapes at the midpoints of the ranked epoch), each twice
    C  the first 80 batches in the order the run is served them, each once (the first 4 left out)
    D  B's 24 again, each right after another copy's update on the same batch (the trial's turns), both copies
       first warmed on A's batches, so that D and B average the same 24

Prints and writes (OUTPUT) one JSON object of seconds per update. docs/cpu_recipe.md ("The trial on the 2-core Zen
3") has the figures. Run it alone on the machine:

    python scripts/trial_batches_probe.py TOKENIZER_FOLDER OUTPUT.json [PRESET]

TOKENIZER_FOLDER: a main job's model folder (its tokenizer is the run's)."""

import json
import statistics
import sys
import tempfile
import time

from hf_vanilla_transformer.utils.allocator import use_fast_allocator


use_fast_allocator()  # re-runs this process as a run runs: mimalloc preloaded, the larger primitive cache

import torch  # noqa: E402
from transformers import AutoTokenizer  # noqa: E402

import hf_vanilla_transformer  # noqa: E402, F401 (registers the tokenizer's classes)
from hf_vanilla_transformer import VanillaTransformerConfig, VanillaTransformerForConditionalGeneration  # noqa: E402
from hf_vanilla_transformer.data.batching import BatchSamplers  # noqa: E402
from hf_vanilla_transformer.data.collating import collate_rows, training_collator  # noqa: E402
from hf_vanilla_transformer.data.corpora import load_corpus  # noqa: E402
from hf_vanilla_transformer.data.pipeline import length_chunks, tokenize_corpus  # noqa: E402
from hf_vanilla_transformer.training.budget.calibration import _Copy, trainer_optimizer  # noqa: E402


if len(sys.argv) not in (3, 4):
    raise SystemExit(__doc__)
tokenizer = AutoTokenizer.from_pretrained(sys.argv[1])
preset = sys.argv[3] if len(sys.argv) == 4 else "small"
torch.manual_seed(0)
train = tokenize_corpus(load_corpus("libreoffice-help-ui"), tokenizer, 256)["train"]
with tempfile.TemporaryDirectory() as scratch:
    sampler = BatchSamplers(length_chunks(train), 0, scratch).of(1024)
    calibration = sampler.shape_sample(18, 1, set())[0::3]
    trial = sampler.shape_sample(24, 1, set())
    served = [batch for _, batch in zip(range(84), sampler, strict=False)]
model = VanillaTransformerForConditionalGeneration(
    VanillaTransformerConfig.from_preset(preset, vocab_size=len(tokenizer), dropout=0.0)
)
collator = training_collator(tokenizer, model.config, torch.device("cpu"))
A, B, C = (collate_rows(train, batches, collator) for batches in (calibration, trial, served))


def new_copy() -> _Copy:
    return _Copy(model, ("fp32", "sdpa", False), torch.device("cpu"), trainer_optimizer(None), None)


def timed(copy_: _Copy, batch: dict) -> float:
    began = time.perf_counter()
    copy_.update(batch)
    return time.perf_counter() - began


figures = {"preset": preset}
steady = new_copy()
for name, batches in (("A_calibration_6_steady", A), ("B_trial_24_steady", B)):
    first, second = [], []
    for batch in batches:
        first.append(timed(steady, batch))
        second.append(timed(steady, batch))
    figures[name], figures[name.replace("steady", "first")] = statistics.fmean(second), statistics.fmean(first)
alone = new_copy()
figures["C_served_80_once"] = statistics.fmean([timed(alone, batch) for batch in C][4:])
paired, other = new_copy(), new_copy()
for batch in A[:4]:  # their Adam states made, first touches done
    other.update(batch)
    paired.update(batch)
in_turns = []
for batch in B:
    other.update(batch)
    in_turns.append(timed(paired, batch))
figures["D_trial_24_in_turns"] = statistics.fmean(in_turns)
print(json.dumps(figures))
with open(sys.argv[2], "w", encoding="utf-8") as file:
    json.dump(figures, file, indent=1)
