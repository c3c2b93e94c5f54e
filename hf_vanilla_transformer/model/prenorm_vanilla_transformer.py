"""Not the paper: the pre-LN sub-layer wiring, x + Dropout(Sublayer(LayerNorm(x))) (Xiong et al. 2020).

`config.pre_layer_norm=True` builds the layers from these forwards and the post-LN layers' parameters (same names,
so checkpoints of either kind load the same way); each stack then ends with a LayerNorm of its own. The paper's
post-LN wiring, LayerNorm(x + Dropout(Sublayer(x))), is the modeling file's. Imported relatively by the modeling file,
and copied beside it by `save_pretrained`.
"""

from torch import nn


class PreLNEncoderLayerForward:
    """The encoder layer's forward with pre-LN sub-layers (mixed into a subclass of the post-LN encoder layer)."""

    def forward(self, hidden_states, attention_mask=None, token_index=None, **kwargs):
        attended, _ = self.self_attn(self.self_attn_layer_norm(hidden_states), attention_mask=attention_mask, **kwargs)
        hidden_states = hidden_states + nn.functional.dropout(attended, p=self.dropout, training=self.training)
        transformed = self.ffn(self.final_layer_norm(hidden_states), token_index)
        return hidden_states + nn.functional.dropout(transformed, p=self.dropout, training=self.training)


class PreLNDecoderLayerForward:
    """The decoder layer's forward with pre-LN sub-layers (mixed into a subclass of the post-LN decoder layer)."""

    def forward(
        self,
        hidden_states,
        attention_mask=None,
        encoder_hidden_states=None,
        encoder_attention_mask=None,
        cache=None,
        token_index=None,
        **kwargs,
    ):
        normed = self.self_attn_layer_norm(hidden_states)
        attended, _ = self.self_attn(normed, attention_mask=attention_mask, cache=cache, **kwargs)
        hidden_states = hidden_states + nn.functional.dropout(attended, p=self.dropout, training=self.training)
        normed = self.encoder_attn_layer_norm(hidden_states)
        attended, _ = self.encoder_attn(normed, encoder_hidden_states, encoder_attention_mask, cache=cache, **kwargs)
        hidden_states = hidden_states + nn.functional.dropout(attended, p=self.dropout, training=self.training)
        transformed = self.ffn(self.final_layer_norm(hidden_states), token_index)
        return hidden_states + nn.functional.dropout(transformed, p=self.dropout, training=self.training)
