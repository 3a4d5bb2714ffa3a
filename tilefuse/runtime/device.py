"""A device with real memory: arenas of bytes, an allocator, host<->device copies.

Address space (byte addresses; 0 is never a block, so it can mean "no block"):
  [0, SEGMENT_BASE_AREA)   reserved: no memory, never allocated
  arenas                   each a numpy byte array at a fixed base address; blocks are aligned to
                           `alignment` bytes and never straddle two arenas

`CPUDevice(capacity_bytes=N)` has one arena of N bytes (first fit inside it, as before).
`CPUDevice()` grows: it starts empty, adds an arena when an allocation does not fit (at least
`arena_bytes`, or the request), and returns an arena that becomes empty to the OS (one small
spare is kept so that per-run IO buffers do not map and unmap memory every call). Arena base
addresses only increase, so an address into a returned arena is never valid again.

Mapped blocks (`map_host`): host memory is this device's memory, so a growable device can make
an existing host array a block without copying it (an arena of its own over the array's bytes,
removed by `free`, never used by `alloc`, outside `reserved_bytes`). A Session maps the
package's constant area (instead of copying it) and each call's input and output arrays
(instead of copy-in / copy-out) when `device.zero_copy` is true: the default for the growable
`CPUDevice()`; a fixed-capacity device models a discrete device's memory and copies everything.

Blocks have a kind: "user" (dev_malloc / alloc) or "segment" (a Session's constant, hidden,
IO-address segments and segment-base records). `compute_network` refuses IO addresses inside
segment blocks of any session (`block_of(..., kind="user")`).

All methods are thread-safe: the allocator and the arena list are guarded by one lock; copies
and views of disjoint blocks run concurrently.
"""
from __future__ import annotations

import bisect
import math
import struct
import threading

import numpy as np

from ..errors import DeviceError, OutOfDeviceMemory
from ..kernels.isa import host_memory_bytes
from ..kernels.threads import aligned_empty

SEGMENT_BASE_AREA = 64       # bytes reserved at address 0
DEFAULT_ARENA_BYTES = 64 << 20
HOST_ALIGN = 64               # host address alignment of an arena's first byte (a cache line)
KINDS = ("user", "segment")


class _Arena:
    __slots__ = ("base", "size", "memory", "free", "used", "mapped")

    def __init__(self, base: int, size: int, memory: np.ndarray | None = None, align: int = HOST_ALIGN):
        self.base, self.size = base, size
        self.mapped = memory is not None        # a host array's bytes (map_host): one block, no free space
        if memory is None:
            try:
                # the host bytes start on an `align` boundary, so a block aligned in device addresses is
                # aligned in host memory too (numpy's large buffers start 16 bytes past a page, which put
                # every tensor and weight of a compiled network 16 bytes off its cache line)
                memory = aligned_empty(size, np.uint8, align, zeros=True)
            except MemoryError:
                raise OutOfDeviceMemory(f"the host refused {size} bytes of device memory") from None
        self.memory = memory
        self.free: list[tuple[int, int]] = [] if self.mapped else [(base, size)]   # sorted (addr, size)
        self.used: dict[int, tuple[int, str]] = {}           # addr -> (size, kind)

    @property
    def end(self) -> int:
        return self.base + self.size


class CPUDevice:
    """Device memory in host RAM.

    capacity_bytes: None (default) grows on demand (arenas of `arena_bytes` or the request);
        an int fixes the device at that many bytes (one arena, pages appear on first use).
    """

    def __init__(self, capacity_bytes: int | None = None, alignment: int = 64, name: str = "cpu0",
                 arena_bytes: int = DEFAULT_ARENA_BYTES):
        if alignment <= 0 or alignment & (alignment - 1):
            raise DeviceError(f"alignment must be a power of two, got {alignment}")
        if capacity_bytes is not None:
            if isinstance(capacity_bytes, bool) or not isinstance(capacity_bytes, (int, np.integer)):
                raise DeviceError(f"capacity_bytes must be an integer or None, got {capacity_bytes!r}")
            if capacity_bytes <= SEGMENT_BASE_AREA:
                raise DeviceError(f"capacity must exceed the {SEGMENT_BASE_AREA}-byte reserved area, "
                                  f"got {capacity_bytes}")
        if isinstance(arena_bytes, bool) or not isinstance(arena_bytes, (int, np.integer)) or arena_bytes < 1:
            raise DeviceError(f"arena_bytes must be a positive integer, got {arena_bytes!r}")
        self.name = name
        self.alignment = alignment
        self.growable = capacity_bytes is None
        self.zero_copy = self.growable      # Sessions map host arrays (map_host) instead of copying
        self.capacity = None if capacity_bytes is None else int(capacity_bytes)
        self.arena_bytes = int(arena_bytes)
        self._lock = threading.RLock()
        self._arenas: list[_Arena] = []           # sorted by base
        self._bases: list[int] = []
        self._next_base = self._align(SEGMENT_BASE_AREA)
        self.bytes_in = 0
        self.bytes_out = 0
        if not self.growable:
            self._add_arena(self.capacity - self._next_base)

    def _align(self, n: int) -> int:
        return -(-int(n) // self.alignment) * self.alignment

    def _add_arena(self, size: int, memory: np.ndarray | None = None) -> _Arena:
        a = _Arena(self._next_base, size, memory, max(HOST_ALIGN, self.alignment))
        self._next_base = self._align(a.end + 1)   # a gap: no block touches two arenas
        self._arenas.append(a)
        self._bases.append(a.base)
        return a

    # ---------------------------------------------------------------- allocator

    @property
    def used_bytes(self) -> int:
        with self._lock:
            return sum(s for a in self._arenas for s, _ in a.used.values())

    @property
    def reserved_bytes(self) -> int:
        """Bytes of host memory the device holds now (its own arenas; mapped host arrays are not)."""
        with self._lock:
            return sum(a.size for a in self._arenas if not a.mapped)

    @property
    def mapped_bytes(self) -> int:
        """Bytes of host arrays mapped as blocks now (map_host; part of used_bytes)."""
        with self._lock:
            return sum(a.size for a in self._arenas if a.mapped)

    def map_host(self, array: np.ndarray, kind: str = "user") -> int:
        """Make a host array's memory a device block without copying (zero copy: this device is
        host memory). The array must be a C-contiguous, writable, non-empty ndarray; kernels then
        read and write the array itself. `free(addr)` removes the block (the array is the
        caller's); `alloc` never places anything in it. Returns the block's address."""
        if not isinstance(array, np.ndarray) or not array.flags.c_contiguous or not array.flags.writeable \
                or array.nbytes == 0:
            found = (f"{type(array).__name__}" if not isinstance(array, np.ndarray) else
                     f"an array with nbytes={array.nbytes}, C-contiguous={array.flags.c_contiguous}, "
                     f"writable={array.flags.writeable}")
            raise DeviceError(f"{self.name}: map_host got {found}; expected a C-contiguous, writable, "
                              f"non-empty ndarray")
        if kind not in KINDS:
            raise DeviceError(f"block kind must be one of {KINDS}, got {kind!r}")
        mem = array.reshape(-1).view(np.uint8)
        with self._lock:
            a = self._add_arena(mem.size, mem)
            a.used[a.base] = (mem.size, kind)
            return a.base

    def alloc(self, nbytes: int, kind: str = "user") -> int:
        """First-fit allocation of an aligned block; returns its address."""
        if isinstance(nbytes, bool) or not isinstance(nbytes, (int, np.integer)) or nbytes <= 0:
            raise DeviceError(f"alloc size must be a positive integer, got {nbytes!r}")
        if kind not in KINDS:
            raise DeviceError(f"block kind must be one of {KINDS}, got {kind!r}")
        size = self._align(nbytes)
        with self._lock:
            for a in self._arenas:
                addr = self._take(a, size, kind)
                if addr is not None:
                    return addr
            if self.growable:
                grow = max(size, self.arena_bytes)
                limit = host_memory_bytes()
                if limit and self.reserved_bytes + grow > limit:
                    raise OutOfDeviceMemory(
                        f"{self.name}: cannot allocate {nbytes} bytes: the device holds {self.reserved_bytes} "
                        f"bytes and this host has {limit}; expected a request that fits in memory")
                a = self._add_arena(grow)
                return self._take(a, size, kind)
            largest = max((f for a in self._arenas for _, f in a.free), default=0)
            raise OutOfDeviceMemory(
                f"{self.name}: cannot allocate {nbytes} bytes: {self.used_bytes} of {self.capacity} "
                f"bytes in use, largest free block {largest} bytes; free some blocks or create the "
                f"device with a larger capacity_bytes (CLI: --device-memory)")

    @staticmethod
    def _take(a: _Arena, size: int, kind: str) -> int | None:
        for i, (addr, free) in enumerate(a.free):        # (a mapped arena has no free space)
            if free >= size:
                if free == size:
                    a.free.pop(i)
                else:
                    a.free[i] = (addr + size, free - size)
                a.used[addr] = (size, kind)
                return addr
        return None

    def _arena_at(self, addr: int) -> _Arena | None:
        i = bisect.bisect_right(self._bases, addr) - 1
        if i >= 0 and addr < self._arenas[i].end:
            return self._arenas[i]
        return None

    def free(self, addr: int) -> None:
        addr = int(addr)
        with self._lock:
            a = self._arena_at(addr)
            entry = a.used.pop(addr, None) if a is not None else None
            if entry is None:
                raise DeviceError(f"{self.name}: free({addr}) of an address that is not an allocated block")
            if a.mapped:                               # the host array goes back to its owner
                i = self._arenas.index(a)
                self._arenas.pop(i)
                self._bases.pop(i)
                return
            size = entry[0]
            i = bisect.bisect(a.free, (addr, 0))
            a.free.insert(i, (addr, size))
            # coalesce with the next and the previous free block
            if i + 1 < len(a.free) and addr + size == a.free[i + 1][0]:
                a.free[i] = (addr, size + a.free.pop(i + 1)[1])
            if i > 0 and a.free[i - 1][0] + a.free[i - 1][1] == addr:
                pa, ps = a.free[i - 1]
                a.free[i - 1] = (pa, ps + a.free.pop(i)[1])
            if self.growable and not a.used:
                self._trim(keep=a)

    def _trim(self, keep: _Arena) -> None:
        """Return empty arenas to the OS; keep `keep` as the one spare if it is small."""
        spare = keep if keep.size <= self.arena_bytes else None
        for a in [a for a in self._arenas if not a.used and a is not spare and not a.mapped]:
            i = self._arenas.index(a)
            self._arenas.pop(i)
            self._bases.pop(i)

    def block_of(self, addr: int, nbytes: int, kind: str | None = None) -> int:
        """The allocated block containing [addr, addr + nbytes) (of `kind`, if given); raises
        DeviceError otherwise."""
        addr, nbytes = int(addr), int(nbytes)
        with self._lock:
            a = self._arena_at(addr)
            if a is not None:
                starts = sorted(a.used)
                i = bisect.bisect_right(starts, addr) - 1
                if i >= 0:
                    base = starts[i]
                    size, k = a.used[base]
                    if addr + nbytes <= base + size:
                        if kind is not None and k != kind:
                            raise DeviceError(f"{self.name}: [{addr}, {addr + nbytes}) lies in a {k} block "
                                              f"at {base}; expected a {kind} block")
                        return base
        raise DeviceError(f"{self.name}: [{addr}, {addr + nbytes}) is not inside an allocated block")

    def block_size(self, addr: int) -> int:
        """Size in bytes of the allocated block that starts at `addr`."""
        with self._lock:
            a = self._arena_at(int(addr))
            if a is None or int(addr) not in a.used:
                raise DeviceError(f"{self.name}: {addr} is not the start of an allocated block")
            return a.used[int(addr)][0]

    # ---------------------------------------------------------------- access

    def _bytes(self, addr: int, n: int) -> np.ndarray:
        """The uint8 array over [addr, addr + n) inside one arena."""
        addr, n = int(addr), int(n)
        with self._lock:
            a = self._arena_at(addr)
        if a is None or n < 0 or addr + n > a.end:
            raise DeviceError(f"{self.name}: [{addr}, {addr + n}) is outside device memory")
        return a.memory[addr - a.base:addr - a.base + n]

    def view(self, addr: int, dtype, shape) -> np.ndarray:
        """A zero-copy array over device memory (what kernels read and write)."""
        dt = np.dtype(dtype)
        n = math.prod(shape) * dt.itemsize
        return self._bytes(addr, n).view(dt).reshape(shape)

    def read_bytes(self, addr: int, n: int) -> bytes:
        return self._bytes(addr, n).tobytes()

    def copy_in(self, addr: int, array) -> None:
        """Host -> device copy into an allocated block."""
        a = np.ascontiguousarray(array)
        self.block_of(addr, a.nbytes)
        self._bytes(addr, a.nbytes)[...] = a.reshape(-1).view(np.uint8)
        with self._lock:
            self.bytes_in += a.nbytes

    def copy_out(self, addr: int, shape, dtype) -> np.ndarray:
        """Device -> host copy; returns a new array."""
        dt = np.dtype(dtype)
        n = math.prod(shape) * dt.itemsize
        self.block_of(addr, n)
        with self._lock:
            self.bytes_out += n
        return self._bytes(addr, n).view(dt).reshape(shape).copy()

    def write_u64(self, addr: int, value: int) -> None:
        struct.pack_into("<Q", self._bytes(addr, 8), 0, int(value))

    def read_u64(self, addr: int) -> int:
        return struct.unpack_from("<Q", self._bytes(addr, 8), 0)[0]

    def __repr__(self) -> str:
        cap = "growable" if self.growable else f"{self.capacity} bytes"
        return f"CPUDevice({self.name}, {self.used_bytes} bytes used, {cap})"


# sizes on the command line ------------------------------------------------------------------

def parse_bytes(text: str) -> int:
    """'512M', '2G', '1.5GiB', '1000000' -> bytes (binary units); ValueError names the format."""
    s = str(text).strip().upper().removesuffix("IB").removesuffix("B")
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
    k = 1
    if s and s[-1] in mult:
        k, s = mult[s[-1]], s[:-1]
    try:
        v = float(s)
    except ValueError:
        raise ValueError(f"{text!r} is not a size; expected a byte count such as 512M, 2G or 1000000") from None
    if not v > 0 or v * k > 1 << 50:
        raise ValueError(f"{text!r} is not a usable size; expected a positive byte count such as 512M or 2G")
    return int(v * k)
