"""The labels: the decoder inputs made from them (§3.1), the label-smoothed loss of §5.4 and its chunked form that
never builds the (tokens, vocabulary) logits.

Imported relatively by the modeling file, and copied beside it by `save_pretrained`.
"""

import torch
from torch import nn

from .inputs_vanilla_transformer import _check_ids, _eager


def shift_tokens_right(labels: torch.Tensor, pad_token_id: int, decoder_start_token_id: int) -> torch.Tensor:
    """Decoder inputs from labels: `decoder_start_token_id` then labels[:-1], with -100 turned into padding (§3.1)."""
    shifted = labels.new_full(labels.shape, pad_token_id)
    shifted[:, 1:] = labels[:, :-1]
    shifted[:, 0] = decoder_start_token_id
    return shifted.masked_fill(shifted == -100, pad_token_id)


def loss_labels(labels: torch.Tensor, vocab_size: int, pad_token_id: int | None, eos_token_id: int | None):
    """`labels` checked (ids in the vocabulary, or -100), with padding turned into -100 unless it is also `</s>`."""
    if _eager():
        _check_ids("labels", labels, vocab_size, allow=(-100,))
    if pad_token_id is not None and pad_token_id != eos_token_id:
        labels = labels.masked_fill(labels == pad_token_id, -100)
    return labels


def project_and_score(
    hidden_states: torch.Tensor,
    lm_head: nn.Linear,
    labels: torch.Tensor | None,
    epsilon: float,
    num_items_in_batch: int | torch.Tensor | None = None,
    training: bool = False,
) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """(loss, logits) of the decoder's output `hidden_states` (B, T, D) under the output projection `lm_head`.

    Training with labels, only the labelled positions are projected (padding costs nothing), chunk by chunk so that
    the (tokens, vocabulary) logits never exist at once, and `logits` is None. Otherwise (evaluation, no labels, or
    under `torch.compile`, where the selection of labelled positions has a data-dependent size) the full (B, T, V)
    logits are returned with the same loss.
    """
    if labels is not None and training and _eager():
        labelled = labels != -100  # (B, T)
        if lm_head.bias is not None:  # an output bias (not the paper): the labelled positions' logits, then the loss
            logits = lm_head(hidden_states[labelled])  # (N, V)
            return label_smoothed_loss(logits, labels[labelled], epsilon, num_items_in_batch), None
        loss = linear_label_smoothed_loss(
            hidden_states[labelled], lm_head.weight, labels[labelled], epsilon, num_items_in_batch
        )
        return loss, None
    logits = lm_head(hidden_states)  # (B, T, V)
    loss = label_smoothed_loss(logits, labels, epsilon, num_items_in_batch) if labels is not None else None
    return loss, logits


def label_smoothed_loss(
    logits: torch.Tensor,
    labels: torch.Tensor,
    epsilon: float,
    num_items_in_batch: int | torch.Tensor | None = None,
) -> torch.Tensor:
    """Label-smoothed cross-entropy (§5.4) summed over target tokens and divided by their number.

    Positions labelled -100 count in neither the sum nor the divisor. Under `Trainer`, `num_items_in_batch` is the
    number of target tokens in the whole update (all accumulation steps and, with `average_tokens_across_devices`,
    all processes), so that the update's gradient is that of the per-token mean loss, whatever the split.
    The smoothed target puts 1 - epsilon + epsilon/V on the reference token and epsilon/V on every other one
    (`torch.nn.functional.cross_entropy(label_smoothing=epsilon)`).
    """
    loss = nn.functional.cross_entropy(
        logits.float().reshape(-1, logits.shape[-1]),  # (B*T, V), softmax in float32
        labels.reshape(-1),
        ignore_index=-100,
        label_smoothing=epsilon,
        reduction="sum",
    )
    return _per_target_token(loss, labels, num_items_in_batch)


def _per_target_token(
    total: torch.Tensor, labels: torch.Tensor, num_items_in_batch: int | torch.Tensor | None
) -> torch.Tensor:
    """`total` divided by the update's target tokens (`num_items_in_batch`), else by the labelled tokens here."""
    if num_items_in_batch is None:
        num_items_in_batch = (labels != -100).sum().clamp(min=1)
    elif isinstance(num_items_in_batch, torch.Tensor):
        num_items_in_batch = num_items_in_batch.to(total.device)
    return total / num_items_in_batch


class _LinearLabelSmoothedLoss(torch.autograd.Function):
    """Sum over tokens of the label-smoothed cross-entropy of `hidden @ weight.T`, computed chunk by chunk.

    The gradient is computed in the forward pass, so that the (tokens, vocabulary) logits never exist at once:
    for each chunk, dLoss/dlogits = softmax(logits) - q (q: the smoothed target distribution), then
    dLoss/dhidden = dlogits @ weight and dLoss/dweight += dlogits.T @ hidden. The backward pass only scales them.
    Matrix products run in `compute_dtype` (the autocast dtype under autocast), softmax and sums in float32.
    """

    @staticmethod
    def forward(ctx, hidden, weight, labels, epsilon, chunk_size, compute_dtype):
        vocab = weight.shape[0]
        with torch.autocast(device_type=hidden.device.type, enabled=False):
            weight_c = weight.to(compute_dtype)
            total = torch.zeros((), dtype=torch.float32, device=hidden.device)
            grad_hidden = torch.empty(hidden.shape, dtype=compute_dtype, device=hidden.device)
            grad_weight = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device)
            for start in range(0, hidden.shape[0], chunk_size):
                chunk = hidden[start : start + chunk_size].to(compute_dtype)  # (C, D)
                target = labels[start : start + chunk_size, None]  # (C, 1)
                logits = (chunk @ weight_c.T).float()  # (C, V)
                log_z = torch.logsumexp(logits, dim=-1, keepdim=True)  # (C, 1)
                picked = logits.gather(-1, target)
                # loss = (1 - eps) * (log Z - z_y) + eps * (log Z - mean_v z_v)
                total += (log_z - (1.0 - epsilon) * picked - epsilon * logits.mean(-1, keepdim=True)).sum()
                grad = logits.sub_(log_z).exp_().sub_(epsilon / vocab)  # softmax - eps / V, in place
                grad.scatter_add_(-1, target, torch.full_like(picked, epsilon - 1.0))
                grad = grad.to(compute_dtype)
                grad_hidden[start : start + chunk_size] = grad @ weight_c
                grad_weight += (grad.T @ chunk).float()
        ctx.save_for_backward(grad_hidden, grad_weight)
        ctx.dtypes = (hidden.dtype, weight.dtype)
        return total

    @staticmethod
    def backward(ctx, grad_output):
        grad_hidden, grad_weight = ctx.saved_tensors
        hidden_dtype, weight_dtype = ctx.dtypes
        return (
            (grad_hidden * grad_output).to(hidden_dtype),
            (grad_weight * grad_output).to(weight_dtype),
            None,
            None,
            None,
            None,
        )


def linear_label_smoothed_loss(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    labels: torch.Tensor,
    epsilon: float,
    num_items_in_batch: int | torch.Tensor | None = None,
    chunk_size: int = 1024,
) -> torch.Tensor:
    """`label_smoothed_loss(hidden @ weight.T, labels, epsilon, num_items_in_batch)` for the hidden states of the
    labelled tokens, (N, D), without materialising the (N, V) logits: less memory and fewer passes over them."""
    device = hidden.device.type
    compute_dtype = torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else hidden.dtype
    total = _LinearLabelSmoothedLoss.apply(hidden, weight, labels, float(epsilon), chunk_size, compute_dtype)
    return _per_target_token(total, labels, num_items_in_batch)
