"""A device with real memory: one byte array, an allocator, host<->device copies.

Address space (byte addresses into the device memory):
  [0, SEGMENT_BASE_AREA)   reserved segment-base area: three u64 base addresses
                           (constants, hidden data, IO addresses), written by copy_constants
  [SEGMENT_BASE_AREA, capacity)  allocatable; blocks are aligned to `alignment` bytes
Address 0 is never returned by alloc, so it can mean "no block".
"""
from __future__ import annotations

import bisect
import struct
import threading

import numpy as np

from ..errors import DeviceError, OutOfDeviceMemory

SEGMENT_BASE_AREA = 64       # bytes reserved at address 0
BASE_SLOTS = {"const": 0, "hidden": 8, "io": 16}


class CPUDevice:
    """Device memory in host RAM. `capacity_bytes` is reserved lazily (pages appear on use)."""

    def __init__(self, capacity_bytes: int = 8 << 30, alignment: int = 64, name: str = "cpu0"):
        if capacity_bytes <= SEGMENT_BASE_AREA:
            raise DeviceError(f"capacity must exceed the {SEGMENT_BASE_AREA}-byte segment-base area, "
                              f"got {capacity_bytes}")
        if alignment <= 0 or alignment & (alignment - 1):
            raise DeviceError(f"alignment must be a power of two, got {alignment}")
        self.name = name
        self.capacity = int(capacity_bytes)
        self.alignment = alignment
        self.memory = np.zeros(self.capacity, dtype=np.uint8)
        self._lock = threading.Lock()
        start = -(-SEGMENT_BASE_AREA // alignment) * alignment
        self._free: list[tuple[int, int]] = [(start, self.capacity - start)]   # sorted (addr, size)
        self._used: dict[int, int] = {}                                       # addr -> size
        self.bytes_in = 0
        self.bytes_out = 0

    # ---------------------------------------------------------------- allocator

    @property
    def used_bytes(self) -> int:
        return sum(self._used.values())

    def alloc(self, nbytes: int) -> int:
        """First-fit allocation of an aligned block; returns its address."""
        if isinstance(nbytes, bool) or not isinstance(nbytes, (int, np.integer)) or nbytes <= 0:
            raise DeviceError(f"alloc size must be a positive integer, got {nbytes!r}")
        size = -(-int(nbytes) // self.alignment) * self.alignment
        with self._lock:
            for i, (addr, free) in enumerate(self._free):
                if free >= size:
                    if free == size:
                        self._free.pop(i)
                    else:
                        self._free[i] = (addr + size, free - size)
                    self._used[addr] = size
                    return addr
            largest = max((f for _, f in self._free), default=0)
            raise OutOfDeviceMemory(
                f"{self.name}: cannot allocate {nbytes} bytes: {self.used_bytes} of {self.capacity} "
                f"bytes in use, largest free block {largest} bytes; free some blocks or create the "
                f"device with a larger capacity_bytes")

    def free(self, addr: int) -> None:
        with self._lock:
            size = self._used.pop(int(addr), None)
            if size is None:
                raise DeviceError(f"{self.name}: free({addr}) of an address that is not an allocated block")
            i = bisect.bisect(self._free, (addr, 0))
            self._free.insert(i, (addr, size))
            # coalesce with the next and the previous free block
            if i + 1 < len(self._free) and addr + size == self._free[i + 1][0]:
                self._free[i] = (addr, size + self._free.pop(i + 1)[1])
            if i > 0 and self._free[i - 1][0] + self._free[i - 1][1] == addr:
                pa, ps = self._free[i - 1]
                self._free[i - 1] = (pa, ps + self._free.pop(i)[1])

    def block_of(self, addr: int, nbytes: int) -> int:
        """The allocated block containing [addr, addr + nbytes); raises DeviceError otherwise."""
        with self._lock:
            for base, size in self._used.items():
                if base <= addr and addr + nbytes <= base + size:
                    return base
        raise DeviceError(f"{self.name}: [{addr}, {addr + nbytes}) is not inside an allocated block")

    # ---------------------------------------------------------------- access

    def view(self, addr: int, dtype, shape) -> np.ndarray:
        """A zero-copy array over device memory (what kernels read and write)."""
        dt = np.dtype(dtype)
        n = int(np.prod(shape)) * dt.itemsize
        if addr < SEGMENT_BASE_AREA or addr + n > self.capacity:
            raise DeviceError(f"{self.name}: view [{addr}, {addr + n}) is outside device memory "
                              f"[{SEGMENT_BASE_AREA}, {self.capacity})")
        return np.ndarray(shape, dtype=dt, buffer=self.memory, offset=addr)

    def copy_in(self, addr: int, array) -> None:
        """Host -> device copy into an allocated block."""
        a = np.ascontiguousarray(array)
        self.block_of(addr, a.nbytes)
        self.memory[addr:addr + a.nbytes] = a.reshape(-1).view(np.uint8)
        self.bytes_in += a.nbytes

    def copy_out(self, addr: int, shape, dtype) -> np.ndarray:
        """Device -> host copy; returns a new array."""
        dt = np.dtype(dtype)
        n = int(np.prod(shape)) * dt.itemsize
        self.block_of(addr, n)
        self.bytes_out += n
        return self.memory[addr:addr + n].view(dt).reshape(shape).copy()

    def write_u64(self, addr: int, value: int) -> None:
        struct.pack_into("<Q", self.memory, addr, int(value))

    def read_u64(self, addr: int) -> int:
        return struct.unpack_from("<Q", self.memory, addr)[0]

    def set_segment_base(self, segment: str, addr: int) -> None:
        self.write_u64(BASE_SLOTS[segment], addr)

    def segment_base(self, segment: str) -> int:
        return self.read_u64(BASE_SLOTS[segment])

    def __repr__(self) -> str:
        return f"CPUDevice({self.name}, {self.used_bytes}/{self.capacity} bytes used)"
