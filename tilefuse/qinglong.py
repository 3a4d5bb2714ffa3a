"""The QingLong paper's API names (seed 002, section 3.3), over tilefuse's device and session.

    from tilefuse.qinglong import (DEV_TO_HOST, HOST_TO_DEV, compute_network, dev_free,
                                   dev_malloc, dev_memcpy)
    i = dev_malloc(dev, x.nbytes)
    dev_memcpy(dev, HOST_TO_DEV, i, x)
    compute_network(sess, [i], [o])            # = sess.compute([i], [o])
    y = dev_memcpy(dev, DEV_TO_HOST, o, shape=..., dtype=np.float32)
    dev_free(dev, i)

The one home of these aliases; the methods they call are `CPUDevice.alloc / free / copy_in /
copy_out` and `Session.compute`.
"""
from __future__ import annotations

import numpy as np

from .errors import DeviceError
from .runtime.device import CPUDevice
from .runtime.session import Session

HOST_TO_DEV, DEV_TO_HOST = "host_to_dev", "dev_to_host"


def dev_malloc(device: CPUDevice, nbytes: int) -> int:
    return device.alloc(nbytes)


def dev_free(device: CPUDevice, addr: int) -> None:
    device.free(addr)


def dev_memcpy(device: CPUDevice, direction: str, addr: int, host=None, shape=None, dtype=np.float32):
    """dev_memcpy(dev, HOST_TO_DEV, addr, array) or dev_memcpy(dev, DEV_TO_HOST, addr, shape=, dtype=)."""
    if direction == HOST_TO_DEV:
        device.copy_in(addr, host)
        return None
    if direction == DEV_TO_HOST:
        if host is not None:
            host[...] = device.copy_out(addr, host.shape, host.dtype)
            return host
        return device.copy_out(addr, shape, dtype)
    raise DeviceError(f"direction must be HOST_TO_DEV or DEV_TO_HOST, got {direction!r}")


def compute_network(session: Session, in_addrs, out_addrs) -> None:
    """QingLong's computeNetwork: run the program on device buffers (`Session.compute`)."""
    session.compute(in_addrs, out_addrs)


__all__ = ["dev_malloc", "dev_free", "dev_memcpy", "compute_network", "HOST_TO_DEV", "DEV_TO_HOST"]
