"""Importers: PyTorch modules through torch.export (`from_torch`), ONNX models (`from_onnx`)."""
from .onnx_import import from_onnx
from .torch_export import from_torch

__all__ = ["from_torch", "from_onnx"]
