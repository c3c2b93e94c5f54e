"""Converting translation models that exist elsewhere into this package's model folders (`vanilla-transformer
convert`): a MarianMTModel folder (`marian.py`), an FSMT folder (`fsmt.py`), a fairseq `transformer` checkpoint with
its dictionaries and BPE codes (`fairseq.py`, `fairseq_tokenizer.py`); and the inverse, a model folder as a stock
MarianMTModel folder (`marian_export.py`, `vanilla-transformer export --format marian`); what they share (`common.py`) and the folder
written (`folder.py`). Each family's quirks become the model's own configuration fields; nothing in the model knows
where its weights came from."""

from .common import ConversionError
from .folder import convert_model, read_source


__all__ = ["ConversionError", "convert_model", "read_source"]
