"""Row ring buffers: seed 003's RAM array on the CPU.

The accelerator of seed 003 keeps the three rows a 3x3 window needs in a 3x3 array of RAMs;
when a new feature-map row arrives it overwrites the oldest RAM row and the row indices rotate,
so the multiply-add array always addresses logical rows 0, 1, 2 in order (its figures 7-8).
`RowRing` is that array for one (N, C, H, W) tensor: it holds `capacity` rows, logical row `r`
lives in physical slot `r % capacity`, writes arrive in row order and overwrite the oldest rows,
and readers address logical rows; a read that crosses the physical end is gathered in order.

Rows are only overwritten once every consumer has released them: each consumer owns a "low
mark" (the first row it still needs); `start` is the smallest low mark, and a write that would
reach past `start + capacity` is an error (the sequential executor) or waits (the pipeline).

`FullRows` has the same interface over a whole tensor (the network input and the streamed
part's outputs, whole blocks of device memory): it never evicts. The stream mode of the runtime
(`runtime/streaming.py`) makes both over views of device memory.
"""
from __future__ import annotations

import numpy as np

from ..errors import TilefuseError


class RingError(TilefuseError, RuntimeError):
    """A row ring was used out of order: a read of evicted or unwritten rows, an overwrite of
    rows a consumer still needs."""


class RowRing:
    """A ring of `capacity` rows of an (N, C, H, W) tensor: storage (N, C, capacity, W)."""

    full = False

    def __init__(self, name: str, shape, capacity: int, dtype=np.float32, consumers: int = 1,
                 blocked: bool = False, buf: np.ndarray | None = None):
        n, c, h, w = (int(s) for s in shape)
        if capacity < 1:
            raise RingError(f"ring '{name}': capacity must be >= 1 row, got {capacity}")
        self.name = name
        self.height = h
        self.channels = c
        self.capacity = int(min(capacity, h))
        self.blocked = bool(blocked)
        # NCHW16c rows: (N, ceil(C/16), cap, W, 16), padded channels written zero by every producer
        # (rows stay axis 2, so every slot computation below is the same); NCHW: (N, C, cap, W)
        want = (n, -(-c // 16), self.capacity, w, 16) if self.blocked else (n, c, self.capacity, w)
        if buf is None:
            buf = np.zeros(want, dtype=dtype)
        elif tuple(buf.shape) != want or buf.dtype != np.dtype(dtype):
            raise RingError(f"ring '{name}': storage {buf.shape} {buf.dtype}, expected {want} {np.dtype(dtype)}")
        self.buf = buf                      # the stream mode's: a block of the hidden segment
        self.end = 0                        # next logical row to be written
        self.lows = [0] * max(consumers, 1)  # first row each consumer still needs

    def reset(self) -> None:
        """Empty, for the next run (the storage is reused)."""
        self.end = 0
        self.lows = [0] * len(self.lows)

    # -------------------------------------------------------------- bookkeeping

    @property
    def start(self) -> int:
        """The oldest logical row still held (every row below it may be overwritten)."""
        return min(self.min_low(), self.end)

    def min_low(self) -> int:
        return min(self.lows)

    def release(self, consumer: int, row: int) -> None:
        """Consumer `consumer` will never read rows below `row` again."""
        if row > self.lows[consumer]:
            self.lows[consumer] = row

    def room_for(self, r1: int) -> bool:
        """Can rows up to r1 (exclusive) be written without overwriting a held row?"""
        return r1 - self.min_low() <= self.capacity

    @property
    def nbytes(self) -> int:
        return self.buf.nbytes

    # -------------------------------------------------------------- rows

    def _slots(self, r0: int, r1: int):
        """Physical (slot, count) pieces for logical rows [r0, r1): one, or two if they wrap."""
        s = r0 % self.capacity
        first = min(r1 - r0, self.capacity - s)
        if first == r1 - r0:
            return ((s, first),)
        return ((s, first), (0, r1 - r0 - first))

    def write_view(self, r0: int, r1: int):
        """A writable (N, C, r1 - r0, W) view for the next rows, or None when they would wrap."""
        self._check_write(r0, r1)
        pieces = self._slots(r0, r1)
        if len(pieces) != 1:
            return None
        s, k = pieces[0]
        return self.buf[:, :, s:s + k]

    def commit(self, r1: int) -> None:
        """Rows up to r1 (exclusive) have been written through `write_view`."""
        self.end = r1

    def store(self, r0: int, rows: np.ndarray) -> None:
        """Copy rows (N, C, R, W) into the slots of logical rows r0.. (== end), wrapping if need
        be; `commit` publishes them."""
        r1 = r0 + rows.shape[2]
        self._check_write(r0, r1)
        at = 0
        for s, k in self._slots(r0, r1):
            self.buf[:, :, s:s + k] = rows[:, :, at:at + k]
            at += k

    def write(self, r0: int, rows: np.ndarray) -> None:
        """Append rows (N, C, R, W) starting at logical row r0 (== end)."""
        self.store(r0, rows)
        self.end = r0 + rows.shape[2]

    def _check_write(self, r0: int, r1: int) -> None:
        if r0 != self.end:
            raise RingError(f"ring '{self.name}': rows arrive in order; expected row {self.end}, got {r0}")
        if r1 > self.height:
            raise RingError(f"ring '{self.name}': row {r1 - 1} is past the tensor height {self.height}")
        if not self.room_for(r1):
            raise RingError(f"ring '{self.name}': writing rows [{r0}, {r1}) would overwrite row "
                            f"{self.min_low()} that a consumer still needs (capacity {self.capacity} rows)")

    def check_read(self, r0: int, r1: int) -> None:
        """Rows [r0, r1) are held (written and not overwritten); RingError otherwise."""
        if r0 < 0 or r1 > self.end or r0 < self.end - self.capacity or r0 > r1:
            raise RingError(f"ring '{self.name}': rows [{r0}, {r1}) requested; held are "
                            f"[{max(0, self.end - self.capacity)}, {self.end})")

    def read(self, r0: int, r1: int) -> np.ndarray:
        """Logical rows [r0, r1) as (N, C, r1 - r0, W): a view when contiguous, else a copy."""
        self.check_read(r0, r1)
        pieces = self._slots(r0, r1) if r1 > r0 else ((0, 0),)
        if len(pieces) == 1:
            s, k = pieces[0]
            return self.buf[:, :, s:s + k]
        return np.concatenate([self.buf[:, :, s:s + k] for s, k in pieces], axis=2)

    def read_into(self, r0: int, r1: int, out: np.ndarray) -> None:
        """Copy logical rows [r0, r1) into out (N, C, r1 - r0, W') (W' >= W: left-aligned)."""
        self.check_read(r0, r1)
        if r1 <= r0:
            return
        at = 0
        w = self.buf.shape[3]
        for s, k in self._slots(r0, r1):
            out[:, :, at:at + k, :w] = self.buf[:, :, s:s + k]
            at += k


class FullRows:
    """The RowRing interface over a whole tensor (no eviction): the network input, the outputs."""

    full = True
    blocked = False

    def __init__(self, name: str, array: np.ndarray, consumers: int = 0, written: bool = False):
        self.name = name
        self.buf = array
        self.channels = array.shape[1]
        self.height = array.shape[2]
        self.capacity = self.height
        self.end = self.height if written else 0
        self.lows = [0] * max(consumers, 1)

    start = RowRing.start
    min_low = RowRing.min_low
    release = RowRing.release

    def room_for(self, r1: int) -> bool:
        return True

    @property
    def nbytes(self) -> int:
        return self.buf.nbytes

    def write_view(self, r0: int, r1: int):
        if r0 != self.end:
            raise RingError(f"'{self.name}': rows arrive in order; expected row {self.end}, got {r0}")
        return self.buf[:, :, r0:r1]

    def commit(self, r1: int) -> None:
        self.end = r1

    def store(self, r0: int, rows: np.ndarray) -> None:
        self.write_view(r0, r0 + rows.shape[2])[...] = rows

    def write(self, r0: int, rows: np.ndarray) -> None:
        self.store(r0, rows)
        self.end = r0 + rows.shape[2]

    def check_read(self, r0: int, r1: int) -> None:
        if r0 < 0 or r1 > self.end:
            raise RingError(f"'{self.name}': rows [{r0}, {r1}) requested; written are [0, {self.end})")

    def read(self, r0: int, r1: int) -> np.ndarray:
        self.check_read(r0, r1)
        return self.buf[:, :, r0:r1]

    def read_into(self, r0: int, r1: int, out: np.ndarray) -> None:
        out[:, :, :r1 - r0, :self.buf.shape[3]] = self.read(r0, r1)
