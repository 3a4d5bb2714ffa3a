"""The pieces a machine model is built from: capacity-checked memories, a timeline of
transfers and compute steps, and byte counters.

* `Scratchpad`: one instance of an on-chip memory (one core's AM, a PE's SB, ...). Buffers are
  allocated from it; an allocation beyond its capacity raises `CapacityError` (never a silent
  spill), and a tile that does not fit the buffer it is loaded into raises too.
* `Timeline`: list scheduling over named resources (each core's compute unit, each link, the
  host). A step starts when its resource is free and the steps it depends on have ended; a
  strategy expresses double buffering by which earlier steps a load waits for.
* `Traffic`: bytes moved per memory level and per link.
"""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

import numpy as np

from ..errors import TilefuseError


class CapacityError(TilefuseError, MemoryError):
    """A buffer or a tile does not fit the on-chip memory it was mapped to."""

    def __init__(self, memory: str, what: str, requested: int, used: int, capacity: float):
        self.memory, self.what, self.requested, self.used, self.capacity = memory, what, requested, used, capacity
        super().__init__(f"{memory}: {what} needs {requested} B but {used} B of {int(capacity)} B are in use "
                         f"({int(capacity) - used} B free); the tile does not fit and a model never spills "
                         f"silently: choose smaller blocks or a larger {memory.split('[')[0]}")


class Buffer:
    """A buffer in a scratchpad: `array` holds data when the model executes functionally."""
    __slots__ = ("memory", "what", "shape", "dtype", "nbytes", "array")

    def __init__(self, memory: "Scratchpad", what: str, shape, dtype, functional: bool):
        self.memory, self.what = memory, what
        self.shape, self.dtype = tuple(int(s) for s in shape), np.dtype(dtype)
        self.nbytes = int(np.prod(self.shape, dtype=np.int64)) * self.dtype.itemsize
        self.array = np.zeros(self.shape, self.dtype) if functional else None

    def load(self, tile: np.ndarray | None, shape=None) -> np.ndarray | None:
        """Put a tile into the buffer (a DMA's destination); the tile must fit."""
        shp = tuple(tile.shape) if tile is not None else tuple(shape)
        need = int(np.prod(shp, dtype=np.int64)) * self.dtype.itemsize
        if need > self.nbytes:
            raise CapacityError(self.memory.name, f"tile {shp} for {self.what}", need, self.nbytes,
                                self.nbytes)
        if self.array is None or tile is None:
            return None
        flat = self.array.reshape(-1)[: int(np.prod(shp))]
        view = flat.reshape(shp)
        view[...] = tile
        return view


class Scratchpad:
    """One instance of an on-chip memory with a hard capacity."""

    def __init__(self, name: str, capacity: float, functional: bool = True):
        self.name, self.capacity, self.functional = name, capacity, functional
        self.used = 0
        self.peak = 0
        self.buffers: list[Buffer] = []

    def alloc(self, what: str, shape, dtype) -> Buffer:
        b = Buffer(self, what, shape, dtype, False)
        if self.used + b.nbytes > self.capacity:
            held = ", ".join(f"{x.what} {x.nbytes} B" for x in self.buffers) or "nothing"
            err = CapacityError(self.name, what, b.nbytes, self.used, self.capacity)
            err.args = (err.args[0] + f" (holding: {held})",)
            raise err
        if self.functional:
            b.array = np.zeros(b.shape, b.dtype)
        self.used += b.nbytes
        self.peak = max(self.peak, self.used)
        self.buffers.append(b)
        return b

    def free(self, b: Buffer) -> None:
        self.buffers.remove(b)
        self.used -= b.nbytes

    def reset(self) -> None:
        self.buffers.clear()
        self.used = 0


class Timeline:
    """List scheduling of steps on named resources.

    A compute unit runs its steps in program order. A link (a resource whose name starts with
    'link:') never idles while a transfer is ready: a transfer issued later in the program but
    ready earlier (a prefetch while a store waits for its compute) uses the link's idle time
    after it became ready, in pieces if need be, and finishes when its last byte has moved (a
    DMA engine with several queues sharing one link).
    """
    GAPS = 64       # idle gaps remembered per link

    def __init__(self):
        self.free_at: dict[str, float] = defaultdict(float)
        self.busy: dict[str, float] = defaultdict(float)
        self.gaps: dict[str, list[list[float]]] = defaultdict(list)
        self.end = 0.0
        self.steps = 0          # steps issued: each one transfer or compute instruction of the target

    def step(self, resource: str, seconds: float, after=()) -> float:
        """Run a step of `seconds` on `resource` once every time in `after` has passed; its end."""
        self.steps += 1
        ready = 0.0
        for t in after:
            if t > ready:
                ready = t
        self.busy[resource] += seconds
        if resource.startswith("link:"):
            gaps = self.gaps[resource]
            left = seconds
            end = ready
            i = 0
            while i < len(gaps) and left > 0:          # idle time after `ready`, earliest first
                g = gaps[i]
                st = g[0] if g[0] > ready else ready
                if st >= g[1]:
                    i += 1
                    continue
                take = min(left, g[1] - st)
                left -= take
                end = st + take
                if st > g[0]:                          # keep the idle part before the piece
                    gaps.insert(i, [g[0], st])
                    i += 1
                if end < g[1]:
                    g[0] = end
                else:
                    gaps.pop(i)
            if left <= 0:
                if end > self.end:
                    self.end = end
                return end
            start = self.free_at[resource]
            if ready > start:
                gaps.append([start, ready])
                if len(gaps) > self.GAPS:
                    del gaps[0]
                start = ready
            seconds = left
        else:
            start = max(self.free_at[resource], ready)
        end = start + seconds
        self.free_at[resource] = end
        if end > self.end:
            self.end = end
        return end


@dataclass
class Traffic:
    level: dict[str, int] = field(default_factory=lambda: defaultdict(int))    # memory -> bytes in+out
    link: dict[str, int] = field(default_factory=lambda: defaultdict(int))     # link -> bytes

    def move(self, link: str, nbytes: int, *levels: str) -> None:
        self.link[link] += int(nbytes)
        for lv in levels:
            self.level[lv] += int(nbytes)
