"""Exports to the engines people translate with, and their translators: `ctranslate2` (CTranslate2), `onnx` (two ONNX
graphs and a NumPy beam search for ONNX Runtime), `rules` (what both record of the model's decoding), `engines` (one
way to open an export, for the scripts); `onnx_marian` (a MarianMTModel as ONNX graphs in Optimum's layout)."""
