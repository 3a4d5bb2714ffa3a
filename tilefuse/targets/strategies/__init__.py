"""Mapping strategies, one per seed paper: name -> class (the `strategy` field of a target file)."""
from __future__ import annotations

from .base import Strategy
from .cambricon import CambriconX
from .ftm7032 import FTM7032
from .host import Host
from .trainer004 import Trainer004
from .vck5000 import VCK5000
from .virtex7 import Virtex7

STRATEGIES: dict[str, type[Strategy]] = {s.name: s for s in (FTM7032, Host, CambriconX, VCK5000, Virtex7, Trainer004)}

__all__ = ["STRATEGIES", "Strategy"]
