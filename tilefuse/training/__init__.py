"""Training with fused memory-bound layers (seed 004, issue 5).

BN, ReLU and Add folded into the convolutions around them, forward and backward, with
traffic accounting counted from the executed schedule. See docs/training.md.
"""
from .optim import SGD
from .patterns import Pattern, find_patterns
from .trainer import Trainer

__all__ = ["SGD", "Trainer", "Pattern", "find_patterns"]
