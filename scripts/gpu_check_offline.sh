#!/usr/bin/env bash
# The GPU check on an offline GPU machine whose image has PyTorch for CUDA but not this package's other dependencies
# (docs/gpu.md, "The GPU check on an offline machine"; ../shared/GPU.md for such an image).
#
#   scripts/gpu_check_offline.sh prepare        # here, with the network and `make setup` done: fills .gpu/
#   scripts/gpu_check_offline.sh run OUT        # there, in the clone with .gpu/ beside it: the check into OUT
#
# `prepare` downloads the wheels of the versions in .venv that the image lacks (for Python 3.12, manylinux x86-64)
# into .gpu/whl and copies the help corpus, its BPE and its tokenized splits from the data cache into .gpu/data
# (about 10 MB: the corpus's Debian packages stay behind). `run` installs the wheels into a folder of its own (the
# image is not changed), sets the offline environment, and runs `vanilla-transformer gpu-check` under `timeout`,
# its nine and a half minutes counted from the script's start (the set-up included). OUT then holds the table
# (gpu_check.md), the JSON (gpu_check.json), the failed tests' tracebacks (gpu_tests_failures.log, where one
# failed), the main job's results.json (main_job_results.json), the GPU's name (machine.txt) and every log and
# JSON of the check's folder without the model weights (logs.tar.gz); the exit status is the check's.
set -uo pipefail
cd "$(dirname "$0")/.."
started=$(date +%s)
# The image lacks these, or holds an older release than transformers and huggingface_hub need (an H200's image of
# 2026-12 had huggingface_hub 1.33 where transformers 5.25 needs >= 2.4, which needs httpx2 and newer click and idna;
# and no kernels, which transformers 5.25's from_pretrained uses by default: without it every load raised).
WHEELS=(transformers datasets evaluate dill multiprocess fsspec sacremoses subword-nmt mock regex
        huggingface_hub hf-xet httpx2 httpcore2 truststore h11 anyio idna click kernels tomlkit)

prepare() {
    grep -qx '/.gpu/' .git/info/exclude 2>/dev/null || echo '/.gpu/' >> .git/info/exclude
    mkdir -p .gpu/whl .gpu/data
    local pinned=()
    for name in "${WHEELS[@]}"; do
        pinned+=("$name==$(.venv/bin/python -c "from importlib.metadata import version; print(version('$name'))")")
    done
    .venv/bin/python -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
        -d .gpu/whl "${pinned[@]}" || exit 1
    local cache="${HF_VANILLA_TRANSFORMER_DATA:-$HOME/.cache/hf_vanilla_transformer}"
    if [[ ! -d "$cache/libreoffice-help-en-de" ]]; then
        echo "no help corpus in $cache: run 'make main' (or 'vanilla-transformer main --max_minutes 1') here once" >&2
        exit 1
    fi
    rm -rf .gpu/data/*
    for entry in libreoffice-help-en-de tokenizers tokenized; do
        [[ -d "$cache/$entry" ]] && cp -a "$cache/$entry" .gpu/data/  # -a: the cache keys by file times
    done
    echo "prepared .gpu: $(ls .gpu/whl | wc -l) wheels, $(du -sh .gpu | cut -f1) in all"
}

run() {
    local out="${1:?usage: scripts/gpu_check_offline.sh run OUT}" site=/tmp/gpu-check-site folder=/tmp/gpu-check
    mkdir -p "$out"
    [[ -d .gpu/whl && -d .gpu/data ]] || { echo "no .gpu/ here: run 'prepare' on a machine with the network" >&2; exit 1; }
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$site" .gpu/whl/*.whl \
        || exit 1
    export PYTHONPATH="$site:$PWD" PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 MPLBACKEND=Agg
    export HF_VANILLA_TRANSFORMER_DATA="$PWD/.gpu/data" TOKENIZERS_PARALLELISM=false
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv > "$out/machine.txt" 2>&1
    python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)" \
        >> "$out/machine.txt" 2>&1
    grep -m1 'model name' /proc/cpuinfo >> "$out/machine.txt"
    rm -rf "$folder"
    # The check keeps to its 570 s from $started; timeout is the safety net past them (a device lends 600 s a call).
    timeout --kill-after=5 $((588 - ($(date +%s) - started))) python3 -m hf_vanilla_transformer gpu-check \
        --started_at "$started" --output_dir "$folder"
    local status=$?
    for name in gpu_check.md gpu_check.json gpu_tests_failures.log main_job_results.json; do
        [[ -f "$folder/$name" ]] && cp "$folder/$name" "$out/"
    done
    tar -czf "$out/logs.tar.gz" -C "$folder" --exclude='*.safetensors' --exclude='*.pt' --exclude='*.bin' \
        --exclude='*.pth' --exclude='*.arrow' . 2>/dev/null
    echo "gpu-check exited $status after $(($(date +%s) - started)) s; its files in $out"
    return "$status"
}

case "${1:-}" in
    prepare) prepare ;;
    run) shift; run "$@" ;;
    *) echo "usage: $0 prepare | run OUT" >&2; exit 2 ;;
esac
