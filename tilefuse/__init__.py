"""tilefuse: define a CNN, compile it once into a program and a constant package, run it many times.

    import tilefuse
    net = tilefuse.models.resnet50(seed=0)
    compiled = tilefuse.compile(net)
    sess = tilefuse.Session(compiled)
    y = sess.run(x)

The names here are the ones a user needs; the rest lives in the subpackages (`tilefuse.ir`,
`tilefuse.compiler`, `tilefuse.runtime`, `tilefuse.kernels`, ...), the QingLong paper's API
names in `tilefuse.qinglong`.
"""
from .kernels import isa as _isa
from .kernels import jitcache as _jitcache

_isa.configure()  # before any kernel is defined: numba fixes its target options then (kernels/isa.py)
_jitcache.configure()  # numba's cache folder keyed by the kernel sources (kernels/jitcache.py)

from . import errors  # noqa: E402
from .compiler import CompiledNetwork, DataPackage, compile, load_package  # noqa: E402
from .errors import GraphError, OutOfDeviceMemory, PackageError, UnsupportedOpError  # noqa: E402
from .interpreter import evaluate  # noqa: E402
from .ir import Network  # noqa: E402
from .runtime import CPUDevice, Session  # noqa: E402

__version__ = "0.1.0"

# heavier parts load on first use
_LAZY = {"models": "tilefuse.models", "imaging": "tilefuse.imaging", "training": "tilefuse.training",
         "qinglong": "tilefuse.qinglong"}
_LAZY_NAMES = {"from_torch": "tilefuse.frontend", "from_onnx": "tilefuse.frontend", "simulate": "tilefuse.targets",
               # moved out of the top level; still importable from here for existing code
               "DataNode": "tilefuse.ir", "OpNode": "tilefuse.ir",
               "dev_malloc": "tilefuse.qinglong", "dev_free": "tilefuse.qinglong",
               "dev_memcpy": "tilefuse.qinglong", "compute_network": "tilefuse.qinglong",
               "HOST_TO_DEV": "tilefuse.qinglong", "DEV_TO_HOST": "tilefuse.qinglong"}


def __getattr__(name):
    import importlib
    if name in _LAZY:
        return importlib.import_module(_LAZY[name])
    if name in _LAZY_NAMES:
        return getattr(importlib.import_module(_LAZY_NAMES[name]), name)
    raise AttributeError(f"module 'tilefuse' has no attribute '{name}'")


__all__ = ["Network", "compile", "CompiledNetwork", "load_package", "DataPackage", "Session", "CPUDevice",
           "evaluate", "from_torch", "from_onnx", "models", "imaging", "training", "qinglong", "errors",
           "GraphError", "PackageError", "UnsupportedOpError", "OutOfDeviceMemory"]
