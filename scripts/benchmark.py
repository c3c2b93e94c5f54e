"""Side-by-side speed and memory of this package's Transformer and transformers' MarianMTModel, as ratios.

Usage:
    python scripts/benchmark.py --quick                               # tiny, small and base sizes, 5 repeats
    python scripts/benchmark.py --sizes base --json docs/benchmark_cpu_base_fp32.json
    python scripts/benchmark.py --device cuda --dtype bf16 --attn flash_attention_2 --sizes base big

What each case measures, and how: `hf_vanilla_transformer/benchmarks/speed.py` (every flag is a field of its
`BenchmarkConfig`). Time nothing else on the machine while it runs.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from transformers import HfArgumentParser

from hf_vanilla_transformer.benchmarks.config import BenchmarkConfig
from hf_vanilla_transformer.benchmarks.speed import run_benchmark, speed_table


@dataclass
class ScriptArguments:
    json: str | None = field(default=None, metadata={"help": "write the figures to this JSON file"})
    quick: bool = field(default=False, metadata={"help": "5 repeats instead of --repeats"})


def main() -> None:
    options, script = HfArgumentParser((BenchmarkConfig, ScriptArguments)).parse_args_into_dataclasses()
    if script.quick:
        options.repeats = 5
    results = run_benchmark(options)
    print("\n" + speed_table(results))
    if script.json:
        Path(script.json).parent.mkdir(parents=True, exist_ok=True)
        Path(script.json).write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
