"""Sharing a trained model: `model_card` (the card, from the template `model_card.md` beside it), `hub` (publishing a
folder in one commit), `plots` (training curves, attention maps, the positional encoding)."""
