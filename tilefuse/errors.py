"""Exception types. Every message says what was found, what was expected, and where."""


class TilefuseError(Exception):
    """Base class of every error tilefuse raises on purpose."""


class GraphError(TilefuseError, ValueError):
    """A network is malformed: wrong shape, dtype or parameter at a named node."""

    def __init__(self, node: str, message: str):
        self.node = node
        super().__init__(f"{node}: {message}")


class UnsupportedOpError(TilefuseError, NotImplementedError):
    """An importer met an operation tilefuse does not implement."""


class PackageError(TilefuseError, ValueError):
    """A data package (in memory or a .tfpkg file) is truncated, altered or inconsistent."""


class DeviceError(TilefuseError, RuntimeError):
    """Bad use of device memory: unknown address, out-of-bounds copy, double free."""


class OutOfDeviceMemory(DeviceError, MemoryError):
    """An allocation did not fit; the message reports requested, used and capacity bytes."""


class NonFiniteError(TilefuseError, FloatingPointError):
    """Training produced NaN or infinity: the message names the step and the first tensor."""
