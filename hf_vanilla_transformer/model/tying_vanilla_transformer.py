"""What the modeling file's `PreTrainedModel` needs of transformers' weight bookkeeping, none of it the paper's: the one
shared embedding matrix (§3.4) as `save_pretrained` and `from_pretrained` must know it (`SharedEmbeddingTyingMixin`),
and the initialisation (`init_module_weights`). Imported relatively by the modeling file, and copied beside it by
`save_pretrained`.

Initialisation (`config.initialization`): the paper names none. `"normal"` (the default), as transformers' own
models (Marian, BART): every linear layer and the embedding ~ N(0, init_std), 0.02 unless the config says otherwise;
biases zero; LayerNorm weight 1, bias 0. It learned faster than `"xavier"` at every size measured
(docs/cpu_recipe.md). `"xavier"`, as the reference implementations (fairseq, tensor2tensor, `torch.nn.Transformer`):

* embeddings (shared, and learned positions) ~ N(0, d_model^-0.5), so that embeddings times sqrt(d_model) have unit
  variance; an untied output projection likewise;
* query/key/value projections Xavier-uniform with gain 1/sqrt(2) (what fairseq uses and what `torch.nn.Transformer`
  gives its fused in-projection: the attention marks them with `xavier_gain`), every other linear layer
  Xavier-uniform; biases zero;
* LayerNorm weight 1, bias 0.
"""

import torch
from torch import nn
from transformers import initialization as init

from .configuration_vanilla_transformer import VanillaTransformerConfig


class SharedEmbeddingTyingMixin:
    """Source embeddings, target embeddings and (with `tie_word_embeddings`) the output projection are one matrix;
    with `source_vocab_size` (fairseq's separate dictionaries) the source embedding is a matrix of its own."""

    def set_input_embeddings(self, value) -> None:
        """The one matrix replaced in every place that holds it (the source's own kept, where it has one); on a
        stack, its own embedding."""
        model = getattr(self, "model", self)  # the encoder-decoder, in the model with the output projection
        if not hasattr(model, "shared"):
            return super().set_input_embeddings(value)
        if self.config.source_vocab_size is None:
            model.encoder.embed_tokens = value
        model.shared = model.decoder.embed_tokens = value

    def get_expanded_tied_weights_keys(self, all_submodels: bool = False) -> dict:
        # Source and target embeddings are one matrix whatever `tie_word_embeddings` says (§3.4); that flag only
        # decides whether the output projection shares it too.
        if all_submodels:
            return super().get_expanded_tied_weights_keys(all_submodels=True)
        tied = dict(self._tied_weights_keys or {})
        if not self.config.tie_word_embeddings:
            tied.pop("lm_head.weight", None)
        if self.config.source_vocab_size is not None:  # not the paper: the source has an embedding of its own
            tied = {name: source for name, source in tied.items() if "encoder.embed_tokens" not in name}
        return tied

    def mark_tied_weights_as_initialized(self, loading_info) -> None:
        """`from_pretrained`: a tied matrix that the checkpoint holds under none of its names stays missing.

        The stacks hold the shared embedding module itself, so all names of the matrix are one parameter. transformers
        marks the tied names (`lm_head.weight`, `*.embed_tokens.weight`) as initialised, which marks that parameter;
        its bookkeeping for custom-code models then drops the source name (`shared.weight`) from the missing keys too,
        and the matrix would stay on the meta device, unreported. Keeping every name of such a matrix missing makes
        transformers report it, materialise it, initialise it (`_init_weights`) and tie the others to it.
        """
        groups: dict[str, set[str]] = {}
        for target, source in self.all_tied_weights_keys.items():
            groups.setdefault(source, {source}).add(target)
        absent = [names for names in groups.values() if names <= loading_info.missing_keys]
        super().mark_tied_weights_as_initialized(loading_info)
        for names in absent:
            loading_info.missing_keys |= names


@torch.no_grad()
def init_module_weights(config: VanillaTransformerConfig, module: nn.Module, lm_head: nn.Module | None) -> None:
    """Initialise the parameters of `module`, a leaf of the model whose output projection is `lm_head`."""
    normal = config.initialization == "normal"
    std = config.init_std or (0.02 if normal else config.d_model**-0.5)
    if isinstance(module, nn.Embedding) or module is lm_head:
        init.normal_(module.weight, mean=0.0, std=std)
        if getattr(module, "bias", None) is not None:  # `output_bias` (not the paper)
            init.zeros_(module.bias)
    elif isinstance(module, nn.Linear):
        if normal:
            init.normal_(module.weight, mean=0.0, std=std)
        else:
            init.xavier_uniform_(module.weight, gain=getattr(module, "xavier_gain", 1.0))
        if module.bias is not None:
            init.zeros_(module.bias)
    elif isinstance(module, nn.LayerNorm):
        init.ones_(module.weight)
        init.zeros_(module.bias)
