"""A bounded multi-stage pipeline over threads (QingLong's copy-in / compute / copy-out).

    results, stats = run_pipeline(items, [stage1, stage2, stage3], slots)

Each item takes a free slot (a resource such as a set of device IO buffers; `len(slots)` items
are in flight at most), then passes through the stages in order, each stage on its own thread;
`stage(item, slot, carry) -> carry` gets what the previous stage returned. The last stage's
return value is the item's result. The first stage runs on the thread that reads the items and
finishes with item i before item i + 1 is read, so a producer may reuse one array for every item
(the copy-in stage has taken it by then). Results come back in input order. The first exception in
any stage stops the pipeline and is re-raised in the caller once every thread has ended.
The caller owns the slots (and frees their buffers afterwards, whatever happened).
`iter_pipeline` is the generator form, for streams of unknown length (imaging.filter_stream).
numpy / numba kernels release the GIL, so the stages overlap for real.
"""
from __future__ import annotations

import queue
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Sequence

_STOP = object()


@dataclass
class PipelineStats:
    stage_names: list[str]
    stage_seconds: list[float] = field(default_factory=list)  # busy time per stage (sum over items)
    items: int = 0
    wall_seconds: float = 0.0
    per_item: list[list[float]] = field(default_factory=list)  # per item, seconds per stage

    def summary(self) -> str:
        n = max(self.items, 1)
        parts = ", ".join(f"{nm} {1e3 * s / n:.2f} ms" for nm, s in zip(self.stage_names, self.stage_seconds))
        return f"{self.items} items in {self.wall_seconds:.3f} s ({self.items / max(self.wall_seconds, 1e-12):.1f}/s); " \
               f"per item: {parts}"


class Progress:
    """A minimal progress bar on stderr (no dependency)."""

    def __init__(self, total: int | None, label: str = "", stream=None, width: int = 30):
        self.total, self.label, self.width = total, label, width
        self.stream = stream or sys.stderr
        self.n = 0
        self.t0 = time.perf_counter()
        self._last = 0.0

    def update(self, k: int = 1) -> None:
        self.n += k
        now = time.perf_counter()
        if now - self._last < 0.1 and self.n != self.total:
            return
        self._last = now
        rate = self.n / max(now - self.t0, 1e-9)
        if self.total:
            f = self.n / self.total
            bar = "#" * int(f * self.width) + "-" * (self.width - int(f * self.width))
            eta = (self.total - self.n) / max(rate, 1e-9)
            self.stream.write(f"\r{self.label} [{bar}] {self.n}/{self.total} {rate:.1f}/s eta {eta:.1f}s")
        else:
            self.stream.write(f"\r{self.label} {self.n} {rate:.1f}/s")
        self.stream.flush()

    def close(self) -> None:
        self.stream.write("\n")
        self.stream.flush()


def iter_pipeline(items: Iterable[Any], stages: Sequence[Callable], slots: Sequence[Any],
                  names: Sequence[str] | None = None, progress: bool | Progress = False,
                  total: int | None = None, stats: PipelineStats | None = None):
    """Generator form: yields (index, result, seconds per stage) in input order as items finish.

    Closing the generator early stops the stages and joins their threads.
    """
    if not slots:
        raise ValueError("a pipeline needs at least one slot (depth >= 1)")
    names = list(names or [f"stage{i}" for i in range(len(stages))])
    if stats is None:
        stats = PipelineStats(names)
    stats.stage_names, stats.stage_seconds = names, [0.0] * len(stages)
    free: queue.Queue = queue.Queue()
    for s in slots:
        free.put(s)
    qs = [queue.Queue(maxsize=len(slots)) for _ in range(len(stages) + 1)]  # stage inputs + results
    error: list[BaseException] = []
    stop = threading.Event()
    bar = progress if isinstance(progress, Progress) else (Progress(total, "run_many") if progress else None)

    def put(q: queue.Queue, v) -> bool:
        while not stop.is_set():
            try:
                q.put(v, timeout=0.05)
                return True
            except queue.Full:
                continue
        return False

    def get(q: queue.Queue):
        while not stop.is_set():
            try:
                return q.get(timeout=0.05)
            except queue.Empty:
                continue
        return _STOP

    def fail(e: BaseException) -> None:
        if not error:
            error.append(e)
        stop.set()

    def feeder():
        # the first stage runs here, before the iterator moves on: a producer may reuse one
        # array for its next item (a decoder's frame buffer), so item i is taken (copied in)
        # before item i + 1 exists
        fn, last = stages[0], len(stages) == 1
        try:
            for i, item in enumerate(items):
                slot = get(free)
                if slot is _STOP:
                    return
                t = time.perf_counter()
                carry = fn(item, slot, None)
                times = [time.perf_counter() - t]
                stats.stage_seconds[0] += times[0]
                if last:
                    free.put(slot)
                if not put(qs[1], (i, item, slot, carry, times)):
                    return
        except BaseException as e:  # the input iterator or the first stage failed
            fail(e)
        finally:
            put(qs[1], _STOP)

    def worker(k: int):
        fn, last = stages[k], k == len(stages) - 1
        while True:
            msg = get(qs[k])
            if msg is _STOP:
                put(qs[k + 1], _STOP)
                return
            i, item, slot, carry, times = msg
            t = time.perf_counter()
            try:
                carry = fn(item, slot, carry)
            except BaseException as e:
                fail(e)
                return
            times.append(time.perf_counter() - t)
            stats.stage_seconds[k] += times[-1]
            if last:
                free.put(slot)  # the last stage is done with the slot's buffers
            if not put(qs[k + 1], (i, item, slot, carry, times)):
                return

    t0 = time.perf_counter()
    threads = [threading.Thread(target=feeder, daemon=True, name=f"pipeline-{names[0]}")]
    threads += [threading.Thread(target=worker, args=(k,), daemon=True, name=f"pipeline-{names[k]}")
                for k in range(1, len(stages))]
    for th in threads:
        th.start()
    try:
        while True:
            msg = get(qs[-1])
            if msg is _STOP:
                break
            i, _, _, result, times = msg
            stats.items += 1
            stats.per_item.append(times)
            stats.wall_seconds = time.perf_counter() - t0
            if bar:
                bar.update()
            yield i, result, times
    finally:
        stop.set()
        for th in threads:
            th.join()
        stats.wall_seconds = time.perf_counter() - t0
        if bar:
            bar.close()
    if error:
        raise error[0]


def run_pipeline(items: Iterable[Any], stages: Sequence[Callable], slots: Sequence[Any],
                 names: Sequence[str] | None = None, progress: bool | Progress = False,
                 total: int | None = None) -> tuple[list[Any], PipelineStats]:
    """Run every item through the stages; return the results in input order and the stats."""
    stats = PipelineStats(list(names or []))
    results = [r for _, r, _ in iter_pipeline(items, stages, slots, names, progress, total, stats)]
    return results, stats
