"""Deploy benchmark: a trained model folder on the held-out test split, this package's generate() (eager and
compiled) against its ONNX Runtime and CTranslate2 exports (float32 and int8), side by side in one run.

Usage:
    vanilla-transformer deploy-benchmark --model_dir outputs/vanilla-transformer-en-de --json deploy.json

What it measures: `hf_vanilla_transformer/benchmarks/deploy.py`. Time nothing else on the machine while it runs.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from pathlib import Path

from transformers import HfArgumentParser

from ..benchmarks.deploy import DeployBenchmarkConfig, deploy_table, run_deploy_benchmark


@dataclass
class ScriptArguments:
    json: str | None = field(default=None, metadata={"help": "write the figures to this JSON file"})


def main(argv: list[str] | None = None, prog: str | None = None) -> None:
    prog = prog or Path(sys.argv[0]).name
    parser = HfArgumentParser((DeployBenchmarkConfig, ScriptArguments), prog=prog, allow_abbrev=False)
    options, script = parser.parse_args_into_dataclasses(args=argv)
    results = run_deploy_benchmark(options)
    print(deploy_table(results))
    if script.json:
        Path(script.json).parent.mkdir(parents=True, exist_ok=True)
        Path(script.json).write_text(json.dumps(results, indent=2) + "\n")
