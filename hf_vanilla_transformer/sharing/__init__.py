"""Sharing a trained model: `model_card` (the card, from the template `model_card.md` beside it), `hub` (publishing a
folder in one commit), `reading` (what `hub` reads of the folder: regular files inside it only), `plots` (training
curves, attention maps, the positional encoding)."""
