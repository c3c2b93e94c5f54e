"""Scale benchmark: WMT-sized corpora (built from the offline LibreOffice help) through the data pipeline, from a raw
TSV to the first update, cold and from the cache, and a 2-process launch of the base recipe; then the batch sampler
alone on 36M pairs. Prints a Markdown table (the one in docs/scale.md).

Usage:
    vanilla-transformer scale-benchmark --pairs 1000000 4500000 --json docs/scale_benchmark.json

What it measures: `hf_vanilla_transformer/benchmarks/scale.py`. Time nothing else on the machine while it runs.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from pathlib import Path

from transformers import HfArgumentParser

from ..benchmarks.scale import ScaleBenchmarkConfig, run_scale_benchmark, scale_table


@dataclass
class ScriptArguments:
    json: str | None = field(default=None, metadata={"help": "write the figures to this JSON file"})


def main(argv: list[str] | None = None, prog: str | None = None) -> None:
    prog = prog or Path(sys.argv[0]).name
    parser = HfArgumentParser((ScaleBenchmarkConfig, ScriptArguments), prog=prog, allow_abbrev=False)
    options, script = parser.parse_args_into_dataclasses(args=argv)
    results = run_scale_benchmark(options)
    print(scale_table(results))
    if script.json:
        Path(script.json).write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")
