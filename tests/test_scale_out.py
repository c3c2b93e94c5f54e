"""Scale-out and kill-safety: two processes equal one with the same global batch, a killed run resumes to the same
weights (SIGKILL during a checkpoint write included), bf16 on CPU learns, a corrupted checkpoint is named."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from hf_vanilla_transformer.training.averaging import checkpoint_folders
from hf_vanilla_transformer.training.checkpoints import CheckpointError, validate_checkpoint

from conftest import FIXTURES, ROOT, logged_losses


FIXTURE = str(FIXTURES / "libreoffice_help_en_de_200.tsv")

# A training run driven by a JSON description; it can SIGKILL itself at a given point.
CHILD = textwrap.dedent(
    """
    import json, os, signal, sys
    from hf_vanilla_transformer.training.arguments import ModelDataArguments, TransformerTrainingArguments
    from hf_vanilla_transformer.training.checkpoints import latest_checkpoint
    from hf_vanilla_transformer.training.run import prepare_run
    from hf_vanilla_transformer.training.settings import settle
    from hf_vanilla_transformer.training.trainer import TransformerTrainer
    from hf_vanilla_transformer.utils.distributed import leave_process_group
    spec = json.loads(sys.argv[1])
    recipe = ModelDataArguments(**spec["recipe"])
    args = TransformerTrainingArguments(**spec["args"])
    kill = spec.get("kill")
    if kill and kill["where"] == "checkpoint_write":
        # Die in the middle of writing checkpoint-<step>: the weights are on disk, optimizer and RNG states not yet.
        original = TransformerTrainer._save_optimizer_and_scheduler
        def dying(self, output_dir):
            if self.state.global_step == kill["step"]:
                os.kill(os.getpid(), signal.SIGKILL)
            return original(self, output_dir)
        TransformerTrainer._save_optimizer_and_scheduler = dying
    if kill and kill["where"] == "before_marker":
        # Die after Trainer wrote every file of checkpoint-<step> (trainer_state.json last), before the marker.
        from transformers import Seq2SeqTrainer
        trainer_save = Seq2SeqTrainer._save_checkpoint
        def dying_after(self, model, trial):
            trainer_save(self, model, trial)
            if self.state.global_step == kill["step"]:
                os.kill(os.getpid(), signal.SIGKILL)
        Seq2SeqTrainer._save_checkpoint = dying_after
    trainer = prepare_run(settle(recipe, args)).trainer
    if kill and kill["where"] == "step":
        from transformers import TrainerCallback
        class Die(TrainerCallback):
            def on_step_end(self, args, state, control, **kwargs):
                if state.global_step == kill["step"]:
                    os.kill(os.getpid(), signal.SIGKILL)
        trainer.add_callback(Die())
    trainer.train(resume_from_checkpoint=latest_checkpoint(args.output_dir))
    if args.should_save:
        with open(os.path.join(args.output_dir, "precision.json"), "w") as file:
            json.dump({"mixed_precision": trainer.accelerator.mixed_precision}, file)
    del trainer  # before the process group: see leave_process_group
    leave_process_group()
    """
)


def spec(output_dir: Path, recipe: dict | None = None, **args) -> dict:
    """The child's run: `recipe` overrides the model and data arguments, `args` the training arguments."""
    return {
        "recipe": {
            **dict(preset="tiny", vocab_size=500, data_files=FIXTURE, max_tokens=300, dropout=0.1, lr_scale=0.5),
            **(recipe or {}),
        },
        "args": {
            "output_dir": str(output_dir),
            "max_steps": 20,
            "save_steps": 10,
            "warmup_steps": 10,
            "logging_steps": 5,
            "eval_strategy": "no",
            "seed": 3,
            "disable_tqdm": True,
            "use_cpu": True,
            **args,
        },
    }


def run_child(description: dict, launcher: list[str] | None = None, script_dir: Path | None = None):
    environment = {**os.environ, "HF_HUB_OFFLINE": "1"}
    if launcher:
        path = script_dir / "child.py"
        path.write_text(CHILD)
        command = [*launcher, str(path), json.dumps(description)]
    else:
        command = [sys.executable, "-c", CHILD, json.dumps(description)]
    return subprocess.run(command, capture_output=True, text=True, timeout=300, env=environment)


def final_weights(output_dir: Path, step: int = 20) -> dict[str, torch.Tensor]:
    return load_file(str(output_dir / f"checkpoint-{step}" / "model.safetensors"))


def assert_same_weights(a: dict, b: dict, atol: float = 0.0) -> None:
    assert a.keys() == b.keys()
    for key in a:
        if atol:
            assert torch.allclose(a[key], b[key], atol=atol), (key, (a[key] - b[key]).abs().max())
        else:
            assert torch.equal(a[key], b[key]), (key, (a[key] - b[key]).abs().max())


@pytest.fixture(scope="module")
def straight(tmp_path_factory) -> Path:
    """20 uninterrupted steps, the reference of the resume tests."""
    output = tmp_path_factory.mktemp("straight")
    result = run_child(spec(output))
    assert result.returncode == 0, result.stderr[-3000:]
    return output


@pytest.mark.slow
@pytest.mark.parametrize("where, step", [("step", 15), ("checkpoint_write", 20), ("before_marker", 20)])
def test_a_killed_run_resumes_to_the_same_weights(straight, tmp_path, where, step):
    description = spec(tmp_path)
    killed = run_child({**description, "kill": {"where": where, "step": step}})
    assert killed.returncode == -signal.SIGKILL
    complete = [path.name for path in checkpoint_folders(tmp_path)]
    assert complete == ["checkpoint-10"]  # a checkpoint cut off while being written is not taken
    if where != "step":
        assert (tmp_path / "checkpoint-20" / "model.safetensors").exists()  # the folder is there, incomplete
        if where == "before_marker":  # every Trainer file is there: only the marker tells it is not complete
            assert (tmp_path / "checkpoint-20" / "trainer_state.json").exists()
        with pytest.raises(CheckpointError, match=r"checkpoint-20/\.complete is missing"):
            validate_checkpoint(tmp_path / "checkpoint-20")
    resumed = run_child(description)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert_same_weights(final_weights(straight), final_weights(tmp_path))
    optimizer_a = torch.load(straight / "checkpoint-20" / "optimizer.pt", weights_only=False)["state"]
    optimizer_b = torch.load(tmp_path / "checkpoint-20" / "optimizer.pt", weights_only=False)["state"]
    assert optimizer_a.keys() == optimizer_b.keys()
    for key, state in optimizer_a.items():
        assert state.keys() == optimizer_b[key].keys()
        for name, value in state.items():
            assert torch.equal(value, optimizer_b[key][name]), (key, name)


@pytest.mark.slow  # a run of the script to corrupt
def test_a_corrupted_checkpoint_names_the_file(straight, tmp_path):
    copy = tmp_path / "checkpoint-10"
    shutil.copytree(straight / "checkpoint-10", copy)
    assert validate_checkpoint(copy) == copy
    weights = copy / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    with pytest.raises(CheckpointError, match=r"checkpoint-10/model\.safetensors is corrupted or truncated"):
        validate_checkpoint(copy)
    shutil.copy2(straight / "checkpoint-10" / "model.safetensors", weights)
    optimizer = copy / "optimizer.pt"
    optimizer.write_bytes(optimizer.read_bytes()[:100])
    with pytest.raises(CheckpointError, match=r"checkpoint-10/optimizer\.pt is corrupted or truncated"):
        validate_checkpoint(copy)
    shutil.copy2(straight / "checkpoint-10" / "optimizer.pt", optimizer)
    (copy / "trainer_state.json").write_text("{")
    with pytest.raises(CheckpointError, match=r"trainer_state\.json cannot be read"):
        validate_checkpoint(copy)


def free_port() -> int:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


CONFIGS = ROOT / "configs" / "accelerate"
# The shipped config files, made to fit this machine by the flags a user would change: two processes in all,
# fp32, a free port. Without a GPU, accelerate's MULTI_GPU type starts CPU processes that train over gloo (`--cpu`
# would start a single process: CPU processes are otherwise spread only through MPI).
FITTED = ["--num_processes", "2", "--mixed_precision", "no", "--dynamo_backend", "no"]


@pytest.fixture(scope="module")
def one_process(tmp_path_factory) -> dict[str, torch.Tensor]:
    """6 updates of one process accumulating 2 batches: the reference of the multi-process runs."""
    output = tmp_path_factory.mktemp("one")
    result = run_child(multi_process_spec(output, gradient_accumulation_steps=2))
    assert result.returncode == 0, result.stderr[-3000:]
    return final_weights(output, 6)


def assert_equal_to_one_process(one_weights: dict, output: Path) -> None:
    two_weights = final_weights(output, 6)
    # A key bias shifts every score of a query by the same amount, which softmax ignores: its gradient is zero up
    # to rounding, and Adam scales that rounding noise to full-size steps. Every other weight must agree.
    noise = {key for key in one_weights if key.endswith("k_proj.bias")}
    assert len(noise) == 2 + 2 * 2  # encoder self-attention, decoder self- and cross-attention
    assert_same_weights(
        {k: v for k, v in one_weights.items() if k not in noise},
        {k: v for k, v in two_weights.items() if k not in noise},
        atol=1e-6,
    )
    state = json.loads((output / "checkpoint-6" / "trainer_state.json").read_text())
    assert state["global_step"] == 6


def multi_process_spec(output: Path, **args) -> dict:
    """6 updates without dropout: dropout draws differ per process; the arithmetic must not. Xavier's initial weights:
    under N(0, 0.02) the attention scores start near uniform, the key projections' gradients are mostly rounding
    noise (as the key biases' always are), and Adam scales that noise to steps of 1e-6 in 6 updates."""
    return spec(
        output, recipe=dict(dropout=0.0, config_overrides="initialization=xavier"), max_steps=6, save_steps=6, **args
    )


def launcher(config: str, *flags: str) -> list[str]:
    """`accelerate launch` with a shipped config file, fitted to this machine, and a free port unless given."""
    port = () if "--main_process_port" in flags else ("--main_process_port", str(free_port()))
    return [
        *(sys.executable, "-m", "accelerate.commands.launch"),
        *("--config_file", str(CONFIGS / config), *FITTED, *port, *flags),
    ]


@pytest.mark.slow  # two processes, and the run they are compared with
def test_two_processes_equal_one_with_the_same_global_batch(one_process, tmp_path):
    double = run_child(
        multi_process_spec(tmp_path / "two"), launcher=launcher("single_node_multi_gpu.yaml"), script_dir=tmp_path
    )
    assert double.returncode == 0, double.stderr[-3000:]
    assert_equal_to_one_process(one_process, tmp_path / "two")


@pytest.mark.slow
def test_two_machines_equal_one_process(one_process, tmp_path):
    """The multi-node config, as two "machines" on this one: ranks 0 and 1 meet at 127.0.0.1."""
    port = str(free_port())
    description = multi_process_spec(tmp_path / "nodes")
    (tmp_path / "child.py").write_text(CHILD)
    machines, logs = [], []
    try:
        for rank in (0, 1):
            command = [
                *launcher("multi_node.yaml", "--machine_rank", str(rank), "--main_process_ip", "127.0.0.1"),
                *("--main_process_port", port, str(tmp_path / "child.py"), json.dumps(description)),
            ]
            # Output to files, not pipes: a rank blocked on a full pipe would stall the other in a collective.
            logs.append(tmp_path / f"rank{rank}.log")
            with logs[-1].open("w") as log:
                environment = {**os.environ, "HF_HUB_OFFLINE": "1"}
                machines.append(subprocess.Popen(command, env=environment, stdout=log, stderr=subprocess.STDOUT))
        for machine, log in zip(machines, logs, strict=True):
            assert machine.wait(timeout=300) == 0, log.read_text()[-3000:]
    finally:
        for machine in machines:
            machine.kill()  # a no-op for a process that has exited
    assert_equal_to_one_process(one_process, tmp_path / "nodes")


@pytest.mark.slow
def test_fsdp_two_processes_equal_one_process(one_process, tmp_path):
    """The FSDP config (FSDP2, layer-wise units, full state dicts), on two CPU processes over gloo."""
    result = run_child(multi_process_spec(tmp_path / "fsdp"), launcher=launcher("fsdp.yaml"), script_dir=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert_equal_to_one_process(one_process, tmp_path / "fsdp")


def test_the_fsdp_config_wraps_every_layer_class_of_the_model():
    import yaml

    from hf_vanilla_transformer.model import modeling_vanilla_transformer

    config = yaml.safe_load((CONFIGS / "fsdp.yaml").read_text())
    assert config["distributed_type"] == "FSDP" and config["fsdp_config"]["fsdp_version"] == 2
    wrapped = config["fsdp_config"]["fsdp_transformer_layer_cls_to_wrap"].split(",")
    model_class = modeling_vanilla_transformer.VanillaTransformerForConditionalGeneration
    assert set(wrapped) == set(model_class._no_split_modules)  # every layer class, and only those
    for name in wrapped:
        assert isinstance(getattr(modeling_vanilla_transformer, name), type), name
    assert config["fsdp_config"]["fsdp_state_dict_type"] == "FULL_STATE_DICT"  # averaging reads plain checkpoints


def assert_learns_in(precision: str, output: Path, use_cpu: bool) -> None:
    """40 updates in `precision` (bf16 or fp16 autocast): the run really used it, and the loss falls from uniform
    (ln 500 = 6.2) towards the unigram entropy. Xavier's initialization: at d_model 32, N(0, 0.02) embeddings are a
    tenth of the positions' scale and take more than 40 updates to leave uniform (the default is measured at real
    sizes, docs/cpu_recipe.md)."""
    recipe = dict(dropout=0.0, lr_scale=1.0, max_tokens=1024, config_overrides="initialization=xavier")
    result = run_child(spec(output, recipe, max_steps=40, save_steps=40, use_cpu=use_cpu, **{precision: True}))
    assert result.returncode == 0, result.stderr[-3000:]
    assert json.loads((output / "precision.json").read_text()) == {"mixed_precision": precision}
    state = json.loads((output / "checkpoint-40" / "trainer_state.json").read_text())
    losses = logged_losses(state["log_history"])
    assert all(torch.isfinite(torch.tensor(losses)))
    assert losses[-1] < losses[0] - 0.5, losses


@pytest.mark.slow
def test_bf16_training_on_cpu_learns(tmp_path):
    assert_learns_in("bf16", tmp_path, use_cpu=True)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_mixed_precision_training_on_gpu_learns(tmp_path, precision):
    assert_learns_in(precision, tmp_path, use_cpu=False)


@pytest.mark.slow
def test_the_train_script_under_two_processes_leaves_one_complete_model_folder(tmp_path):
    """Both processes train; the main one alone averages, evaluates and writes the folder (no race on its files,
    no process waiting for checkpoints it cannot see), and both exit cleanly. The data is prepared once for the
    machine: the corpus read, the BPE learned and the training split tokenized by one process, read by the other."""
    fixture_40 = str(FIXTURES / "libreoffice_help_en_de_test_40.tsv")
    command = [
        *launcher("single_node_multi_gpu.yaml"),
        str(ROOT / "scripts" / "train.py"),
        *("--preset", "tiny", "--max_steps", "8", "--save_steps", "4", "--output_dir", str(tmp_path / "run")),
        *("--data_files", FIXTURE, "--validation_files", fixture_40, "--test_files", fixture_40),
        *("--vocab_size", "500", "--max_tokens", "300", "--average_last", "2", "--average_window", "0.5"),
        *("--test_beams", "1", "--data_cache_dir", str(tmp_path / "cache")),
        *("--disable_tqdm", "true", "--use_cpu", "true"),
    ]
    result = subprocess.run(
        command, capture_output=True, text=True, timeout=300, env={**os.environ, "HF_HUB_OFFLINE": "1"}
    )
    assert result.returncode == 0, result.stderr[-3000:]
    results = json.loads((tmp_path / "run" / "results.json").read_text())
    assert results["averaged_checkpoints"] == ["checkpoint-4", "checkpoint-8"]
    assert results["test"]["pairs"] == 40
    assert result.stdout.count("test sacreBLEU") == 1  # printed by the main process only
    setups = [json.loads((tmp_path / "run" / f"setup-rank{rank}.json").read_text())["stages"] for rank in (0, 1)]
    assert [setup["tokenize"]["tokenized_here"] for setup in setups] == [True, False]
    assert setups[0]["tokenize"]["pairs"] == setups[1]["tokenize"]["pairs"] > 0
    assert all(setup["first update"]["since_start_seconds"] > 0 for setup in setups)
    for kind in ("corpora", "tokenizers", "tokenized"):  # one of each in the machine's cache
        assert len(list((tmp_path / "cache" / kind).iterdir())) == 1, kind
