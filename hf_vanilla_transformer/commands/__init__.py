"""The command line: `vanilla-transformer <command> ...` (installed with the package; also `python -m
hf_vanilla_transformer <command> ...`), one module per command, each a `main(argv, prog)` over the package's rooms:

train, main          train.py: a training run from a recipe and flags; the main job (the machine's recipe)
translate            translate.py: a file or standard input, with a model folder or an export
score                score.py: sacreBLEU and chrF on a test split or your files
export               export.py: CTranslate2 or ONNX
convert              convert.py: a MarianMTModel or FSMT folder or a fairseq checkpoint into a model folder
average              average.py: the last checkpoints of a run averaged into a model folder
push                 push.py: a model folder to the Hugging Face Hub
plot-attention       plot_attention.py: attention maps of a sentence
benchmark, deploy-benchmark, scale-benchmark   measurements, side by side (benchmarks/)
gpu-check            gpu_check.py: the gpu tests, a 3-minute main job and the benchmark as one table (a CPU: scaled down)
configs              configs.py: the recipes and accelerate files shipped with the package, and where they are
cli.py               the dispatcher (the console script's entry point)

The scripts in the repository's `scripts/` folder are the same commands, as files.
"""
