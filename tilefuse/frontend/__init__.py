"""Importers: PyTorch modules through torch.fx (`from_torch`)."""
from .torch_fx import from_torch

__all__ = ["from_torch"]
