"""Seconds per update of the main job's Trainer (`cpu` recipe, `small`, bf16, eager attention, 1,024-token batches)
between two updates, with the training batches' lengths padded to a multiple, in this process's environment (set
ONEDNN_PRIMITIVE_CACHE_CAPACITY before it to compare oneDNN's primitive caches). Prints one JSON line: the seconds
per update, the distinct padded batch shapes of an epoch, the tokens trained on. docs/cpu_recipe.md ("Batch shapes
and oneDNN's primitive cache") has the figures and the commands.

    python scripts/update_speed_probe.py MULTIPLE LAST [FIRST] [FLAG ...]   # e.g. 1 1300 800: updates 800..1300

Flags after the numbers are the training command's, added to the main job's (`--dataloader_num_workers 1`). The
probe runs nothing else: run it alone on the machine, one variant after the other."""

import itertools
import json
import os
import sys
import time


numbers = list(itertools.takewhile(str.isdigit, sys.argv[1:4]))  # the leading numbers, then the flags
extra = sys.argv[1 + len(numbers) :]
if len(numbers) < 2 or (extra and not extra[0].startswith("--")):
    raise SystemExit(__doc__)
multiple, last = int(numbers[0]), int(numbers[1])
first = int(numbers[2]) if len(numbers) == 3 else 100
os.environ.setdefault("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "1024")  # oneDNN's default unless set: no package choice

from hf_vanilla_transformer.utils.allocator import use_fast_allocator  # noqa: E402


use_fast_allocator()

from transformers import TrainerCallback  # noqa: E402

import hf_vanilla_transformer.utils.device as device_module  # noqa: E402


# The collator's and the plan's padding: set before the modules that read it are imported.
device_module.pad_multiple = lambda device: multiple

from hf_vanilla_transformer.training.recipes import parse_run  # noqa: E402
from hf_vanilla_transformer.training.run import prepare_run  # noqa: E402


flags = ["--recipe", "cpu", "--preset", "small", "--precision", "bf16", "--attn_implementation", "eager"]
flags += ["--output_dir", f"/tmp/update-speed-probe-{os.getpid()}", "--max_steps", str(last), "--eval_strategy", "no"]
flags += ["--save_strategy", "no", "--disable_tqdm", "true", "--logging_steps", "100000", *extra]
run = prepare_run(parse_run(flags))
marks = {}


class Marks(TrainerCallback):
    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step in (first, last):
            marks[state.global_step] = time.perf_counter()


run.trainer.add_callback(Marks())
run.trainer.train()
figures = {
    "multiple": multiple,
    "primitive_cache": os.environ["ONEDNN_PRIMITIVE_CACHE_CAPACITY"],
    "updates": [first, last],
    "seconds_per_update": (marks[last] - marks[first]) / (last - first),
    "shapes_in_epoch": len(run.data.batches.of(1024).shape_counts(multiple)),
    "tokens": run.trainer.target_tokens_seen,
    "flags": extra,
}
print(json.dumps(figures), flush=True)
