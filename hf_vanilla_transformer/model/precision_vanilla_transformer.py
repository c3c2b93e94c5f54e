"""Layer normalisation in float32 under CPU autocast: not in the paper, a guard of its post-LN residual stream.

Imported relatively by the modeling file, and copied beside it by `save_pretrained`.
"""

import torch
from torch import nn


class VanillaTransformerLayerNorm(nn.LayerNorm):
    """`nn.LayerNorm` that normalises in float32 under autocast, on every device.

    CUDA's autocast runs LayerNorm in float32 whatever its input; the CPU's has no rule for it and runs it in the
    input's dtype. With float32 weights the input is float32 anyway (the residual stream starts from the float32
    embeddings), but with bf16 weights (or bf16 `inputs_embeds`) CPU autocast would normalise in bf16 and round the
    residual stream of this post-LN model to 8 bits of mantissa after every sub-layer. Under autocast this returns
    float32, as CUDA's autocast does; outside autocast it is `nn.LayerNorm`.
    """

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        device = hidden_states.device.type
        if not torch.is_autocast_enabled(device):
            return super().forward(hidden_states)
        with torch.autocast(device_type=device, enabled=False):
            weight = self.weight.float() if self.weight is not None else None
            bias = self.bias.float() if self.bias is not None else None
            return nn.functional.layer_norm(hidden_states.float(), self.normalized_shape, weight, bias, self.eps)
