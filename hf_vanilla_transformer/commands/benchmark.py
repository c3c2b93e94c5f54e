"""Side-by-side speed and memory of this package's Transformer and transformers' MarianMTModel, as ratios.

Usage:
    vanilla-transformer benchmark --quick                               # tiny, small and base sizes, 5 repeats
    vanilla-transformer benchmark --sizes base --json docs/benchmark_cpu_base_fp32.json
    vanilla-transformer benchmark --device cuda --dtype bf16 --attn flash_attention_2 --sizes base big

What each case measures, and how: `hf_vanilla_transformer/benchmarks/speed.py` (every flag is a field of its
`BenchmarkConfig`). Time nothing else on the machine while it runs.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from pathlib import Path

from transformers import HfArgumentParser

from ..benchmarks.config import BenchmarkConfig
from ..benchmarks.speed import run_benchmark, speed_table


@dataclass
class ScriptArguments:
    json: str | None = field(default=None, metadata={"help": "write the figures to this JSON file"})
    quick: bool = field(default=False, metadata={"help": "5 repeats instead of --repeats"})


def main(argv: list[str] | None = None, prog: str | None = None) -> None:
    prog = prog or Path(sys.argv[0]).name
    parser = HfArgumentParser((BenchmarkConfig, ScriptArguments), prog=prog, allow_abbrev=False)
    options, script = parser.parse_args_into_dataclasses(args=argv)
    if script.quick:
        options.repeats = 5
    results = run_benchmark(options)
    print("\n" + speed_table(results))
    if script.json:
        Path(script.json).parent.mkdir(parents=True, exist_ok=True)
        Path(script.json).write_text(json.dumps(results, indent=2) + "\n")
