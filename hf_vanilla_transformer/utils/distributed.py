"""Decisions the main process takes for every process of a launch, so that all of them act at the same update
(save, stop) or on the same value (the checkpoint to resume from, the run's plan). In a single process each is the
identity. And the end of a process's part in a launch (`leave_process_group`)."""

from __future__ import annotations

import gc

import torch


def is_distributed() -> bool:
    return torch.distributed.is_available() and torch.distributed.is_initialized()


def main_process_decides(flag: bool, device=None) -> bool:
    """The main process's `flag`, in every process (a collective: every process must call it at the same point) on
    `device` (the one the processes train on; default: the CPU)."""
    if not is_distributed():
        return flag
    tensor = torch.tensor([int(flag)], device=device if device is not None else "cpu")
    torch.distributed.broadcast(tensor, src=0)
    return bool(tensor.item())


def main_process_value(value):
    """The main process's `value` (any picklable object), in every process (a collective, as above). Through
    accelerate's `PartialState`, which joins the launch's process group if nothing has yet."""
    from accelerate.utils import broadcast_object_list

    return broadcast_object_list([value])[0]


def result_or_error(function, *arguments):
    """`function(*arguments)`, or the exception it raised: a process that fails before a collective still joins it
    (every process must), and every process then raises the main process's error."""
    try:
        return function(*arguments)
    except Exception as error:
        return error


def leave_process_group() -> None:
    """End this process's part in a multi-process launch (nothing to do in a single process). Call it once the
    run's trainer is unreachable.

    The order matters under gloo: a DDP reducer keeps a reference to the process group, and if the reducer drops
    the last one, the group's destructor runs with the GIL held and joins gloo's worker threads, which may be
    waiting for the GIL to free the tensors of the last collective (Trainer's final all-gather): a hang, or an
    abort when it happens at interpreter exit. So the trainer goes first (collected here), then the group, whose
    last reference is dropped from Python, whose binding releases the GIL while the threads stop.
    """
    if is_distributed():
        gc.collect()
        torch.distributed.destroy_process_group()
