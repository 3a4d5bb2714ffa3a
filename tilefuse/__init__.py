"""tilefuse: define a CNN, compile it once into a program and a constant package, run it many times.

    import tilefuse
    net = tilefuse.models.resnet50(seed=0)
    compiled = tilefuse.compile(net)
    sess = tilefuse.Session(compiled)
    y = sess.run(x)
"""
from . import errors
from .compiler import CompiledNetwork, DataPackage, compile, load_package
from .errors import GraphError, OutOfDeviceMemory, PackageError, UnsupportedOpError
from .interpreter import evaluate
from .ir import DataNode, Network, OpNode
from .runtime import (DEV_TO_HOST, HOST_TO_DEV, CPUDevice, Session, dev_free, dev_malloc,
                      dev_memcpy)

__version__ = "0.1.0"


def compute_network(session: Session, in_addrs, out_addrs) -> None:
    """QingLong's computeNetwork: run the program on device buffers."""
    session.compute(in_addrs, out_addrs)


_LAZY = {"models": "tilefuse.models", "imaging": "tilefuse.imaging", "training": "tilefuse.training"}


def __getattr__(name):
    # heavier parts load on first use
    import importlib
    if name in _LAZY:
        return importlib.import_module(_LAZY[name])
    if name == "simulate":
        return importlib.import_module("tilefuse.targets").simulate
    if name in ("from_torch", "from_onnx"):
        return getattr(importlib.import_module("tilefuse.frontend"), name)
    raise AttributeError(f"module 'tilefuse' has no attribute '{name}'")


__all__ = ["Network", "DataNode", "OpNode", "compile", "CompiledNetwork", "DataPackage",
           "load_package", "Session", "CPUDevice", "evaluate", "dev_malloc", "dev_free", "dev_memcpy",
           "compute_network", "HOST_TO_DEV", "DEV_TO_HOST", "GraphError", "PackageError",
           "UnsupportedOpError", "OutOfDeviceMemory", "errors", "models", "from_torch", "from_onnx"]
