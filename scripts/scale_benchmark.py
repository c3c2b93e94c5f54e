"""Scale benchmark: WMT-sized corpora (built from the offline LibreOffice help) through the data pipeline, from a raw
TSV to the first update, cold and from the cache, and a 2-process launch of the base recipe; then the batch sampler
alone on 36M pairs. Prints a Markdown table (the one in docs/scale.md).

Usage:
    python scripts/scale_benchmark.py --pairs 1000000 4500000 --json docs/scale_benchmark.json

What it measures: `hf_vanilla_transformer/benchmarks/scale.py`. Time nothing else on the machine while it runs.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from transformers import HfArgumentParser

from hf_vanilla_transformer.benchmarks.scale import ScaleBenchmarkConfig, run_scale_benchmark, scale_table


@dataclass
class ScriptArguments:
    json: str | None = field(default=None, metadata={"help": "write the figures to this JSON file"})


def main() -> None:
    options, script = HfArgumentParser((ScaleBenchmarkConfig, ScriptArguments)).parse_args_into_dataclasses()
    results = run_scale_benchmark(options)
    print(scale_table(results))
    if script.json:
        Path(script.json).write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
