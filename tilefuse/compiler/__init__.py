"""Compiler: passes, lowering, memory planning, REOFF packing and the package file."""
from .compile import CompiledNetwork, Plan, compile
from .package import DataPackage, load_package, save_package

__all__ = ["compile", "CompiledNetwork", "Plan", "DataPackage", "load_package", "save_package"]
