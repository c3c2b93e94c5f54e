"""The one shared embedding matrix (§3.4) under transformers' tied-weight bookkeeping: what `save_pretrained` and
`from_pretrained` must know of it. Not the paper's; mixed into the modeling file's `PreTrainedModel`, imported
relatively by it, and copied beside it by `save_pretrained`.
"""


class SharedEmbeddingTyingMixin:
    """Source embeddings, target embeddings and (with `tie_word_embeddings`) the output projection are one matrix;
    with `source_vocab_size` (fairseq's separate dictionaries) the source embedding is a matrix of its own."""

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
