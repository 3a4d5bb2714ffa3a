"""Importers: PyTorch modules through torch.fx (`from_torch`), ONNX models (`from_onnx`)."""
from .onnx_import import from_onnx
from .torch_fx import from_torch

__all__ = ["from_torch", "from_onnx"]
