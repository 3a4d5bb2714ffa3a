"""Wait until this process's worker threads have gone idle, between engines of a same-run comparison.

ONNX Runtime's intra-op workers spin after a run (its default `session.intra_op.allow_spinning`)
for tens of milliseconds, not the few the benchmarks' old fixed 20 ms pause assumed: measured on the
2-core development VM after two MobileNetV2 runs (2026-11-27), the process kept a whole core busy
through a 20 ms and a 50 ms pause and 0.3 of one over 200 ms. An engine started meanwhile shares its
cores with that spinner: tilefuse's MobileNetV2 batch 1 ran 50 ms (median) 20 ms after ORT, 11.5 ms
200 ms after (numba's parallel regions wait at their barrier for the worker the spinner displaces).
So the engines' turns are separated by `quiesce()`: sleep until the process's CPU time (every thread,
`time.process_time`) grows by less than a tenth of a core over a 5 ms window, at least `least`
seconds, at most `most`. It only waits: no engine's settings change.
"""
from __future__ import annotations

import time


def quiesce(least: float = 0.02, most: float = 1.0, window: float = 0.005, idle: float = 0.1) -> float:
    """Sleep until this process is idle (see the module docstring); returns the seconds waited."""
    t0 = time.perf_counter()
    time.sleep(least)
    while time.perf_counter() - t0 < most:
        c, t = time.process_time(), time.perf_counter()
        time.sleep(window)
        if time.process_time() - c < idle * (time.perf_counter() - t):
            break
    return time.perf_counter() - t0
