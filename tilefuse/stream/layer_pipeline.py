"""Layer pipeline over cores: the streamed layers split into stages of balanced work.

Seed 003 gives every layer its own hardware stage and notes that the stages' work must be
about equal, or the slowest stage stalls the pipeline. Here the layers (in topological order)
are cut into `workers` contiguous stages with the largest stage FLOP count as small as possible
(`balance_stages`, an exact linear-partition DP), and each stage runs on its own thread.

Rows pass between stages through the rings themselves, which act as bounded queues: a tensor
that crosses a stage boundary gets `queue_bands` extra bands of capacity; a consumer waits
until its producer has written the rows its band needs, a producer waits until every consumer
has released the rows it is about to overwrite. Each stage executes its steps in the order of
the sequential schedule, and that order satisfies every wait with the sequential capacities,
so the pipeline cannot deadlock (the earliest unfinished step of the global order can always
run). OpenBLAS is held to one thread per stage while the pipeline runs
(`kernels.threads.blas_threads`), so stages do not oversubscribe the cores.
"""
from __future__ import annotations

import threading

import numpy as np

from ..errors import GraphError
from ..kernels.threads import Scratch, blas_threads
from .executor import RingSet, StreamExecutor, compute_band
from .schedule import BandSchedule


def balance_stages(costs: list[int], stages: int) -> list[int]:
    """Stage index of each item: contiguous groups, at most `stages`, minimizing the largest
    group sum (ties: the earliest cut). Every stage gets at least one item when possible."""
    n = len(costs)
    k = max(1, min(stages, n))
    prefix = [0]
    for c in costs:
        prefix.append(prefix[-1] + c)
    INF = float("inf")
    # best[j][i]: smallest max-sum splitting items[:i] into j groups; cut[j][i]: start of the last group
    best = [[INF] * (n + 1) for _ in range(k + 1)]
    cut = [[0] * (n + 1) for _ in range(k + 1)]
    best[0][0] = 0
    for j in range(1, k + 1):
        for i in range(j, n + 1):
            for s in range(j - 1, i):
                v = max(best[j - 1][s], prefix[i] - prefix[s])
                if v < best[j][i]:
                    best[j][i], cut[j][i] = v, s
    out = [0] * n
    i = n
    for j in range(k, 0, -1):
        s = cut[j][i]
        for t in range(s, i):
            out[t] = j - 1
        i = s
    return out


class PipelineExecutor:
    """Runs a schedule as `workers` stage threads connected by bounded rings."""

    def __init__(self, sched: BandSchedule, workers: int = 2, queue_bands: int = 2, kernels: str = "fast",
                 winograd: bool = True, algorithm: str | None = None, layout: str = "nchwc"):
        self.sched = sched
        # runners and consumer slots are shared; each stage's kernels run on its own thread only
        self.seq = StreamExecutor(sched, threads=1, kernels=kernels, winograd=winograd, algorithm=algorithm,
                                  layout=layout)
        # balanced by estimated time, not FLOPs: Winograd layers do a quarter of their nominal
        # FLOPs and im2col (conv1) runs at half the direct kernel's rate (measured, ResNet18 at 4K:
        # FLOP-balanced stages were busy 2.38 s and 1.47 s)
        self.costs = [r.cost() for r in self.seq.runners]
        self.stage_of = balance_stages(self.costs, workers)
        self.workers = max(self.stage_of) + 1
        extra = {}
        for name, t in sched.tensors.items():
            if t.whole:
                continue
            if any(self.stage_of[c] != self.stage_of[t.producer] for c, _ in t.consumers):
                extra[name] = queue_bands * t.band
        self.crossing = sorted(extra)
        self.rings = RingSet(sched, extra, self.seq.blocked)
        self.seq.rings = self.rings
        self.stage_steps = [[s for s in sched.steps if self.stage_of[s[0]] == k] for k in range(self.workers)]
        self.scratch = [Scratch() for _ in range(self.workers)]
        for layer, runner in zip(sched.layers, self.seq.runners):
            for slot, n in runner.scratch_need().items():
                self.scratch[self.stage_of[layer.index]].reserve(slot, n, getattr(runner, "acc", runner.dtype))
        self.stage_seconds = [0.0] * self.workers
        self.wait_seconds = [0.0] * self.workers

    def stage_costs(self) -> list[float]:
        out = [0.0] * self.workers
        for l, c in zip(self.sched.layers, self.costs):
            out[self.stage_of[l.index]] += c
        return out

    def stage_flops(self) -> list[int]:
        out = [0] * self.workers
        for l in self.sched.layers:
            out[self.stage_of[l.index]] += l.flops
        return out

    def run_streamed(self, x: np.ndarray) -> dict[str, np.ndarray]:
        import time
        sched = self.sched
        rows = self.rings.bind(x)
        cond = threading.Condition()
        error: list[BaseException] = []
        self.stage_seconds = [0.0] * self.workers
        self.wait_seconds = [0.0] * self.workers

        def ready(li, r0, r1) -> bool:
            layer = sched.layers[li]
            for name, win in zip(layer.inputs, layer.windows):
                ring = rows[name]
                if ring.end < min(win.rows(r0, r1)[1], ring.height):
                    return False
            return rows[layer.output].room_for(r1)

        def stage(k: int):
            scratch = self.scratch[k]
            try:
                for li, r0, r1 in self.stage_steps[k]:
                    t0 = time.perf_counter()
                    with cond:
                        cond.wait_for(lambda: error or ready(li, r0, r1))
                        if error:
                            return
                    t1 = time.perf_counter()
                    layer = sched.layers[li]
                    runner = self.seq.runners[li]
                    out = rows[layer.output]
                    ins = [rows[n] for n in layer.inputs]
                    try:
                        compute_band(runner, ins, out, scratch, r0, r1)
                    except Exception as e:
                        raise GraphError(layer.name, f"streamed {layer.kind} on rows [{r0}, {r1}) "
                                                     f"failed in stage {k}: {e}") from e
                    with cond:
                        out.commit(r1)
                        for ring, slot, low in zip(ins, self.seq.slots[li], runner.release_rows(r1)):
                            ring.release(slot, low)
                        cond.notify_all()
                    self.wait_seconds[k] += t1 - t0
                    self.stage_seconds[k] += time.perf_counter() - t1
            except BaseException as e:
                with cond:
                    if not error:
                        error.append(e)
                    cond.notify_all()

        threads = [threading.Thread(target=stage, args=(k,), name=f"stream-stage{k}", daemon=True)
                   for k in range(self.workers)]
        with blas_threads(1):
            for t in threads:
                t.start()
            for t in threads:
                t.join()
        if error:
            raise error[0]
        return {s: rows[s].buf for s in sched.sinks}
