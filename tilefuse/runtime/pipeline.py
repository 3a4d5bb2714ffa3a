"""A bounded multi-stage pipeline over threads (QingLong's copy-in / compute / copy-out).

    results, stats = run_pipeline(items, [stage1, stage2, stage3], slots)

Each item takes a free slot (a resource such as a set of device IO buffers; `len(slots)` items
are in flight at most), then passes through the stages in order, each stage on its own thread;
`stage(item, slot, carry) -> carry` gets what the previous stage returned. The last stage's
return value is the item's result. Results come back in input order. The first exception in
any stage stops the pipeline and is re-raised in the caller once every thread has ended;
slots are always handed back to the caller's `release` (so buffers can be freed).
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


def run_pipeline(items: Iterable[Any], stages: Sequence[Callable], slots: Sequence[Any],
                 names: Sequence[str] | None = None, progress: bool | Progress = False,
                 total: int | None = None) -> tuple[list[Any], PipelineStats]:
    if not slots:
        raise ValueError("run_pipeline needs at least one slot (depth >= 1)")
    names = list(names or [f"stage{i}" for i in range(len(stages))])
    stats = PipelineStats(names, [0.0] * len(stages))
    free: queue.Queue = queue.Queue()
    for s in slots:
        free.put(s)
    qs = [queue.Queue(maxsize=len(slots)) for _ in stages]   # input queue of each stage
    results: dict[int, Any] = {}
    timings: dict[int, list[float]] = {}
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
        try:
            for i, item in enumerate(items):
                slot = get(free)
                if slot is _STOP:
                    return
                if not put(qs[0], (i, item, slot, None)):
                    free.put(slot)
                    return
        except BaseException as e:  # the input iterator itself failed
            fail(e)
        finally:
            put(qs[0], _STOP)

    def worker(k: int):
        fn, last = stages[k], k == len(stages) - 1
        while True:
            msg = get(qs[k])
            if msg is _STOP:
                if not last:
                    put(qs[k + 1], _STOP)
                return
            i, item, slot, carry = msg
            t = time.perf_counter()
            try:
                carry = fn(item, slot, carry)
            except BaseException as e:
                free.put(slot)
                fail(e)
                if not last:
                    put(qs[k + 1], _STOP)
                return
            dt = time.perf_counter() - t
            stats.stage_seconds[k] += dt
            timings.setdefault(i, [0.0] * len(stages))[k] = dt
            if last:
                results[i] = carry
                free.put(slot)
                if bar:
                    bar.update()
            elif not put(qs[k + 1], (i, item, slot, carry)):
                free.put(slot)
                return

    t0 = time.perf_counter()
    threads = [threading.Thread(target=feeder, daemon=True, name="pipeline-feed")]
    threads += [threading.Thread(target=worker, args=(k,), daemon=True, name=f"pipeline-{names[k]}")
                for k in range(len(stages))]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    # drain anything left in the queues so the caller gets every slot back
    for q in qs:
        while True:
            try:
                msg = q.get_nowait()
            except queue.Empty:
                break
            if msg is not _STOP:
                free.put(msg[2])
    stats.wall_seconds = time.perf_counter() - t0
    if bar:
        bar.close()
    if error:
        raise error[0]
    stats.items = len(results)
    stats.per_item = [timings[i] for i in range(len(results))]
    return [results[i] for i in range(len(results))], stats
