"""Where the ONNX translator lived before `deploy/`: the README of every ONNX export already shipped imports it from
here (`from hf_vanilla_transformer.export_onnx import OnnxTranslator`)."""

from .deploy.onnx import export_onnx  # noqa: F401
from .deploy.onnx_translator import OnnxTranslator  # noqa: F401
