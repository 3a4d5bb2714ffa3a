"""Threads for every kernel in tilefuse: one pool, one thread-count rule, one BLAS limiter,
one scratch allocator, one step thread count. Used by the inference kernels (`kernels/`, `kernels/conv/`), the
row-band kernels of the stream mode (`kernels/bands.py`), the training kernels and the image
filters (`imaging/`).

Parallelism is ours, not the BLAS library's: a kernel splits its work into tasks whose
boundaries depend only on the layer shape (never on the thread count), and `parallel_for`
(fn(task)) or `parallel_range` (fn(i, tid)) runs them on one shared ThreadPoolExecutor, the
calling thread working too. Numba kernels are `nogil` and numpy's matmul drops the GIL, so the
threads run truly in parallel. Because every output element is computed by the same code in
the same order whichever thread runs its task, results are bitwise identical for 1 and 2 (or
any number of) threads.

While our threads run, OpenBLAS is held at one thread (`blas_threads(1)`, from `kernels/blas.py`)
so the two levels of parallelism do not oversubscribe the cores.

The thread count: `resolve_threads(None)` is every core this process may run on (`cpu_count`,
the CPU affinity); a positive int is taken as given. Scratch: `scratch(name, shape, dtype)` is
a per-thread buffer reused across calls; `Scratch` is the same allocator as an object, for
callers that account for their buffers (the stream mode reports its scratch bytes). The training
kernels read the thread count a step set for its thread (`using`, `nthreads`, `split`).
"""
from __future__ import annotations

import itertools
import math
import operator
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np

_POOL: ThreadPoolExecutor | None = None
_POOL_LOCK = threading.Lock()


class _Local(threading.local):
    """Per-thread state, with class-level defaults: a missing attribute read through getattr's
    default raises and catches an AttributeError inside, ~1 us a read, and numba_region read two
    per layer on the main thread (which never sets `worker`)."""
    worker = False      # a thread of our pool (a nested region runs inline there)
    numba_nt = 0        # numba's thread count as last set from this thread
    team = 0            # times that count grew (libgomp then starts workers: kernels/placement.py reads them again)
    capture = None      # a list while `capture_regions` records this thread's task loops


_LOCAL = _Local()


def cpu_count() -> int:
    """Cores this process may run on (its CPU affinity; os.cpu_count() where there is none)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def resolve_threads(threads) -> int:
    """None -> all cores (`cpu_count`); otherwise a positive int."""
    if threads is None:
        return cpu_count()
    t = int(threads)
    if t < 1:
        raise ValueError(f"threads must be a positive integer or None, got {threads!r}")
    return t


def _pool() -> ThreadPoolExecutor:
    global _POOL
    with _POOL_LOCK:
        if _POOL is None:
            _POOL = ThreadPoolExecutor(max_workers=max(2, cpu_count()), thread_name_prefix="tilefuse",
                                       initializer=_mark_worker)
        return _POOL


def _mark_worker() -> None:
    _LOCAL.worker = True


def _spread(body, nt: int) -> None:
    """body(tid) for tid in range(nt): tid 0 on the calling thread, the others on the pool.

    Every body takes its work from a shared source until none is left, so when the caller's
    body returns all work has been taken: a worker that has not started by then is cancelled
    rather than waited for (on a loaded machine the OS may not run it for a whole time slice;
    the caller has done its share meanwhile). Waits for the workers that started; re-raises the
    caller's exception, else the first worker's."""
    futs = [_pool().submit(body, tid) for tid in range(1, nt)]
    err = None
    try:
        body(0)
    except BaseException as e:
        err = e
    for f in futs:
        if f.cancel():
            continue
        try:
            f.result()
        except BaseException as e:
            err = err or e
    if err is not None:
        raise err


def _width(threads, ntasks: int) -> int:
    """Threads a parallel region uses: at most `threads` (None: all cores) and `ntasks`; 1 inside
    a pool worker (a nested region runs inline, so it can never wait for its own pool)."""
    if _LOCAL.worker:
        return 1
    return min(resolve_threads(threads), ntasks)


def parallel_for(fn, tasks, threads=None) -> None:
    """Run fn(task) for every task; `threads` workers at most (None: all cores).

    Tasks are handed out dynamically; they must write disjoint outputs.
    """
    if _LOCAL.capture is not None:
        _LOCAL.capture.append(None)      # not a replayable task loop (capture_regions)
    tasks = list(tasks)
    nt = _width(threads, len(tasks))
    if nt <= 1:
        for t in tasks:
            fn(t)
        return
    it = iter(tasks)
    lock = threading.Lock()

    def body(_tid):
        while True:
            with lock:
                t = next(it, None)
            if t is None:
                return
            fn(t)

    _spread(body, nt)


def pool_region(seq, threads, ntasks: int, *args) -> int:
    """A task loop as `numba_region` runs one, always on our pool (or the calling thread): workers
    `seq(counter, tid, *args)` take tasks from counter[0] inside numba, one Python call per worker (not
    per task, as `parallel_for`). For the memory-bound flat and row kernels (element-wise chunks,
    softmax and layer-norm rows, the tiled permute) that sit between BLAS calls on our pool in
    attention blocks: numba's OpenMP team, spinning or parked beside those, cost 0.5-1 ms a region
    on the 2-core development machine (benchmarks/RESULTS.md, thirty-fifth session). Returns the
    thread count used."""
    if _LOCAL.capture is not None:
        _LOCAL.capture.append(None)      # not a replayable task loop (capture_regions)
    nt = _width(threads, ntasks)
    counter = np.zeros(COUNTER_SLOTS, np.int64)
    if nt <= 1:
        seq(counter, 0, *args)
        return 1
    _spread(lambda tid: seq(counter, tid, *args), nt)
    return nt


def parallel_range(ntasks: int, fn, threads=None) -> None:
    """fn(i, tid) for i in range(ntasks), handed out dynamically over min(threads, ntasks)
    threads; tid (0 = the caller) indexes per-thread accumulators the caller sized for
    `threads`."""
    if _LOCAL.capture is not None:
        _LOCAL.capture.append(None)      # not a replayable task loop (capture_regions)
    nt = _width(threads, ntasks)
    if nt <= 1:
        for i in range(ntasks):
            fn(i, 0)
        return
    counter = itertools.count()

    def body(tid):
        while True:
            i = next(counter)              # atomic under the GIL
            if i >= ntasks:
                return
            fn(i, tid)

    _spread(body, nt)


# Numba parallel regions ---------------------------------------------------------------------
# The numba kernels (conv/k1x1.py, conv/direct.py, conv/stem.py, conv/winograd.py) run a layer's
# task table inside one numba function: a `prange` over the tasks, compiled with parallel=True,
# on numba's persistent thread pool (OpenMP or TBB where available). One call per layer, no
# Python per task, no thread pool hand-off per task: the per-layer dispatch cost stays a few
# microseconds whatever the thread count. Every such kernel has its worker loop compiled without
# parallel=True too (`seq(counter, tid, *args)`: takes tasks from the shared counter), used for one
# thread, inside our own pool's workers, and on our pool where numba's would wait for unscheduled
# threads (`region_plan`).
#
#     numba_region(par, seq, threads, ntasks, *args)   ->  par(nt, *args) on nt threads, or seq workers
#
# `par` runs `for _ in prange(nt)` (one worker per thread) and each worker takes the next task from
# a shared atomic counter (conv/_nb.atomic_add) until none is left: the tasks are handed out
# dynamically, so a thread the OS does not schedule (a loaded machine) never holds up the others
# with a fixed share of the work. Tasks write disjoint outputs; which thread runs one does not
# change its bits.
#
# numba's "workqueue" layer (the fallback when neither OpenMP nor TBB is installed) aborts the
# process when two threads launch at once, so launches are serialized there; OpenMP and TBB take
# concurrent launches. The thread count is numba's per-thread setting, set here (not inside the
# jitted loop: that would keep numba from caching it).

_NUMBA: dict = {}
_NUMBA_LOCK = threading.Lock()

# a task loop's counter: counter[0] hands out the tasks; the other slots are the workers' own, zero at the
# start of every region (a `par` makes its counter with this many slots too): a two-phase loop counts its
# first phase's tasks there (kernels/se_conv.py: scale the input, then the 1x1 on it, in one region). The conv
# kernels' counters (conv/_nb.new_counter(nt)) hold the team width in slot 3 and a chunk count per worker past
# them: conv/_nb.take gives each worker its own contiguous chunk of the tasks first
COUNTER_SLOTS = 4


def numba_max_threads() -> int:
    """The most threads a numba parallel region can use (NUMBA_NUM_THREADS, default: all CPUs; read
    once: numba fixes it when it starts its pool, and every kernel call asks)."""
    n = _NUMBA.get("max_threads")
    if n is None:
        from numba import config
        n = _NUMBA["max_threads"] = max(1, int(config.NUMBA_NUM_THREADS))
    return n


# GNU OpenMP's idle threads spin before they sleep (GOMP_SPINCOUNT, 300000 by default). On a machine
# with idle cores the workers spin (GOMP_SPIN_DEFAULT): 3,000,000 iterations, ~43 ms of one core per
# worker after the last region on the Ice Lake development VM, about what ONNX Runtime's workers spin
# after a run (~34 ms there). A shorter spin made every run after an idle gap 2-3x slower on the KVM
# development VMs: the first four regions of the run each waited ~2 ms for the parked worker
# (MobileNetV2 batch 1 at 2 threads, `benchmarks/idle_gaps.py`: 15.3-15.8 ms a run after a 200 ms or
# 1 s gap with 30000, 6.2-6.6 ms with 3,000,000, 4.8-5.4 back to back either way; ONNX Runtime 5.3
# and 11.6 ms after the same gaps; benchmarks/RESULTS.md, eighth session). On a machine with more
# runnable threads than cores any spinning starves the thread being waited for (measured on the
# loaded 2-core development machine: an empty 2-thread region took 700 us spinning, 70 us passive,
# 26 us on the Python pool). So the wait policy is chosen at import (below), before libgomp loads:
# TILEFUSE_WAIT=spin|passive if set; else OMP_WAIT_POLICY / GOMP_SPINCOUNT if the user set
# them; else passive when the runnable threads of other processes (/proc/stat procs_running less
# this process's running threads, the least of five samples taken now: not the 1-minute load
# average, which a benchmark run just before would inflate) exceed 3/4 of the usable cores, spin
# otherwise. `wait_policy()` says which, with the count it saw.
# libgomp reads those variables once, when it loads, and numba's pool binds to the first libgomp.so.1 the
# process loaded: torch's own copy when torch was imported first. So the policy is chosen when tilefuse is
# imported (`_choose_early`), which a later `import torch` then obeys; a libgomp loaded before that keeps its
# defaults, and `wait_policy()` says so. It matters: with torch's defaults (torch imported first), a 40 ms
# burst of another thread of the process (a preprocessing thread) made the next MobileNetV2 batch 1 run at
# 2 threads 8-14 ms against 3.2-3.7 with the spin below (the woken worker shared the caller's core, which
# the OS still counted as the less loaded one, and spun there; benchmarks/RESULTS.md, 2026-12-03). Each run
# now also keeps the workers off the caller's core (kernels/placement.py), whichever libgomp it is.
GOMP_SPIN_DEFAULT = "3000000"


def _gomp_mapped() -> str | None:
    """The file of a libgomp this process has loaded (/proc/self/maps), or None (none, or no /proc)."""
    try:
        with open("/proc/self/maps") as f:
            for ln in f:
                if "libgomp" in ln:
                    return ln.split(None, 5)[-1].strip()
    except OSError:
        pass
    return None


def _others_running(samples: int = 5) -> int:
    """Runnable threads of other processes (`_others_now`): the least of a few samples 2 ms apart,
    so a moment's burst (this process's own threads excluded, e.g. a BLAS pool still spinning
    after a call) does not set the wait policy for the whole life of the process."""
    seen = []
    for i in range(samples):
        if i:
            time.sleep(0.002)
        seen.append(_others_now())
    return min(seen)


def _choose_wait_policy() -> str:
    want = os.environ.get("TILEFUSE_WAIT", "").strip().lower()
    if want not in ("spin", "passive"):
        if "OMP_WAIT_POLICY" in os.environ or "GOMP_SPINCOUNT" in os.environ:
            return "user (" + ", ".join(f"{k}={os.environ[k]}" for k in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")
                                       if k in os.environ) + ")"
        others = _NUMBA["wait_others"] = _others_running()
        want = "passive" if others > 0.75 * cpu_count() else "spin"
    if want == "passive":
        os.environ["OMP_WAIT_POLICY"] = "PASSIVE"
    else:
        os.environ.pop("OMP_WAIT_POLICY", None)
        os.environ["GOMP_SPINCOUNT"] = os.environ.get("GOMP_SPINCOUNT", GOMP_SPIN_DEFAULT)
    return want


def _choose_early() -> None:
    """At import: the wait policy, into the environment, before a libgomp loads (see GOMP_SPIN_DEFAULT);
    if one is loaded already, which (its own settings apply: `wait_policy()` reports them)."""
    with _NUMBA_LOCK:
        if "wait" not in _NUMBA:
            first = _gomp_mapped()
            if first is not None:
                _NUMBA["gomp_first"] = first
            _NUMBA["wait"] = _choose_wait_policy()


def wait_policy() -> str:
    """How numba's OpenMP threads wait between regions: 'spin', 'passive' (with the other runnable
    threads seen when the choice was made) or the user's setting; or that a libgomp loaded before tilefuse
    was imported keeps its own defaults, which file, and what to do."""
    numba_layer()
    w = _NUMBA["wait"]
    w = f"{w} ({_NUMBA['wait_others']} others running)" if "wait_others" in _NUMBA else w
    first = _NUMBA.get("gomp_first")
    if first is not None and not w.startswith("user"):
        w = (f"libgomp defaults, not {w}: {first} was loaded before tilefuse was imported (import tilefuse "
             f"before torch, or set GOMP_SPINCOUNT={GOMP_SPIN_DEFAULT} in the environment)")
    return w


def numba_layer() -> str:
    """numba's threading layer ('omp', 'tbb' or 'workqueue'), starting its pool if needed."""
    if "layer" not in _NUMBA:
        import numba
        from numba.np.ufunc import parallel
        _choose_early()
        parallel._launch_threads()
        _NUMBA["set"] = getattr(parallel, "_set_num_threads", None) or numba.set_num_threads
        _NUMBA["layer"] = numba.threading_layer()
    return _NUMBA["layer"]


_WIDTHS: dict = {}    # int threads -> min(threads, NUMBA_NUM_THREADS) (~0.5 us a region to derive)


def region_threads(threads, ntasks: int) -> int:
    """Threads a numba parallel region of `ntasks` tasks runs on: min(threads (None: all cores),
    ntasks, NUMBA_NUM_THREADS); 1 inside one of our pool's workers."""
    if _LOCAL.worker:
        return 1
    w = _WIDTHS.get(threads) if type(threads) is int else None
    if w is None:
        w = min(resolve_threads(threads), numba_max_threads())
        if type(threads) is int:
            _WIDTHS[threads] = w
    return min(w, ntasks)


def _others_now() -> int:
    """Runnable threads of other processes now: /proc/stat procs_running minus this process's
    threads in state R (0 where /proc is not readable)."""
    try:
        with open("/proc/stat") as f:
            running = next(int(ln.split()[1]) for ln in f if ln.startswith("procs_running"))
        ours = 0
        for t in os.listdir("/proc/self/task"):
            try:
                with open(f"/proc/self/task/{t}/stat") as f:
                    ours += f.read().rsplit(")", 1)[1].split()[0] == "R"
            except (OSError, IndexError):
                pass
    except (OSError, StopIteration, ValueError):
        return 0
    return max(0, running - ours)


REGION_RESAMPLE_S = 1.0


def region_mode(nt: int) -> str:
    """Where a numba kernel's task loop runs on nt > 1 threads: 'numba' (numba's OpenMP / TBB
    pool, `par`) or 'pool' (our pool: `seq` workers on the calling thread and pool threads, the
    caller never waiting for a worker that has not started); `region_plan(nt)[0]`."""
    return region_plan(nt)[0]


def region_plan(nt: int) -> tuple[str, int]:
    """(mode, width) for a task loop that wants nt > 1 threads. TILEFUSE_REGIONS=numba|pool if set
    (numba at width nt, or our pool); else by the runnable threads of other processes
    (`_others_now`, the smaller of the last two samples, taken at most every REGION_RESAMPLE_S):
    - they leave nt cores free: ('numba', nt) (a region starts in microseconds on an idle machine);
    - they leave fewer, but at least half of nt and two: ('numba', the free cores): numba's
      end-of-region barrier waits for every worker, and one the OS has descheduled for another
      process costs a time slice per layer, so the team shrinks to the free cores; the tasks are
      handed out dynamically and a task's bits do not depend on which thread runs it;
    - fewer still: ('pool', nt), where the caller never waits for a worker that has not started
      (measured on the shared 2-core development machine at 2 threads, MobileNetV2 batch 1, median
      of 30 runs: 56 ms a run on numba's pool, 12.5 ms on ours).
    The second case is for large machines: at 16 threads on 16 cores, one runnable thread of any
    other process used to put every region on our pool, which costs ~0.4 ms a region there
    (`benchmarks/scaling.py`'s "python pool us" at 16 threads on the device machine)."""
    mode = _NUMBA.get("mode")
    if mode is None:
        want = os.environ.get("TILEFUSE_REGIONS", "").strip().lower()
        mode = _NUMBA["mode"] = want if want in ("numba", "pool") else "auto"
    if mode != "auto":
        return mode, nt
    now = time.monotonic()
    if now - _NUMBA.get("sampled", -1e9) > REGION_RESAMPLE_S:
        # the smaller of two reads, and of the last two samples: other load must persist across
        # samples a second apart. One read races with this process's own OpenMP threads going
        # from spinning (counted as running in /proc/stat) to sleeping (not counted when its
        # task files are read next), and a single such read put the idle 2-core development
        # machine on the pool for a second at a time: MobileNetV2 batch 1 at 2 threads ran
        # 13.6-14.4 ms there instead of 8.7-10.3 (benchmarks/RESULTS.md, 2026-11-27)
        sample = min(_others_now(), _others_now())
        _NUMBA["others"] = min(sample, _NUMBA.get("last", sample))
        _NUMBA["last"], _NUMBA["sampled"] = sample, now
        _NUMBA["cpus"] = cpu_count()     # resampled with the load: a syscall, ~1 us a layer if per call
    free = _NUMBA["cpus"] - _NUMBA["others"]
    if free >= nt:
        return "numba", nt
    if free >= max(2, -(-nt // 2)):
        return "numba", free
    return "pool", nt


_REGIONS = {"numba": 0, "narrowed": 0, "pool": 0, "serial": 0, "replayed": 0}


def region_counts(reset: bool = False) -> dict:
    """How many task loops ran where since the last reset: 'numba' (numba's pool at the session's
    width), 'narrowed' (numba's pool, fewer threads: other processes held cores), 'pool' (ours),
    'serial' (one task or one thread: on the calling thread); and 'replayed': the bound calls that
    replayed a recording (`replaying`; their loops count above too). Counted without a lock (a count may be
    off by a few under concurrent sessions); `benchmarks/networks.py` prints them."""
    out = dict(_REGIONS)
    if reset:
        for k in _REGIONS:
            _REGIONS[k] = 0
    return out


class capture_regions:
    """with capture_regions() as calls: the task loops this thread starts through `numba_region` are
    recorded as (par, seq, threads, ntasks, args) tuples in `calls`, in order (they still run); a
    `parallel_for` / `parallel_range` records None (a loop that cannot be replayed). The runtime's
    bound conv layers (kernels/registry.py) record a layer's call once and then replay its task loops
    with `replay_regions`, skipping the Python that derived their arguments (~5 us a layer)."""

    __slots__ = ("calls", "_prev")

    def __enter__(self) -> list:
        self._prev = _LOCAL.capture
        self.calls = _LOCAL.capture = []
        return self.calls

    def __exit__(self, *exc) -> None:
        _LOCAL.capture = self._prev


REPLAY_INLINE = True   # replay_regions: numba_region's decisions inlined (False: a numba_region call per loop)


def replay_regions(calls) -> None:
    """Run the task loops `capture_regions` recorded, in order, each as numba_region runs it: where it runs
    is decided again now. numba_region's steps are inlined for the common case (numba's OpenMP / TBB pool, no
    capture, not inside our pool's worker): ~1 us a loop less of Python (MobileNetV2 / RegNetY batch 1 replay
    ~90 loops a run); any other case goes through numba_region itself."""
    if not REPLAY_INLINE or _LOCAL.capture is not None or _LOCAL.worker or _NUMBA.get("layer", "workqueue") == \
            "workqueue":
        for par, seq, threads, ntasks, args in calls:
            numba_region(par, seq, threads, ntasks, *args)
        return
    plan = None                      # region_plan's answer for this call's loops (resampled once a second)
    for par, seq, threads, ntasks, args in calls:
        width = _WIDTHS.get(threads) if type(threads) is int else None
        if width is None:
            width = region_threads(threads, 1 << 30)
        if width <= 1 or ntasks <= 1:
            _run_serial(seq, args)
            continue
        if plan is None or plan[0] != width:
            plan = (width,) + region_plan(width)
        if plan[1] == "pool":
            numba_region(par, seq, threads, ntasks, *args)
            continue
        _run_numba(par, width, plan[2], args)


# replaying() on or off: TILEFUSE_REPLAY=0 (read at import) or threads.REPLAY = False turns every bound
# call back into the full path, e.g. for A/B runs that flip module-level kernel switches between calls
# (benchmarks/net_ab.py), which a replayed call would not see
REPLAY = os.environ.get("TILEFUSE_REPLAY", "1").strip() not in ("0", "false", "no", "off")


def replaying(run):
    """fn(*operands) = run(*operands), from its second call on replayed (`replay_regions`) while the
    operands are the same objects as when it was recorded (`capture_regions`). For a kernel whose
    work is all in task loops started through numba_region with arguments that depend only on its
    operands and fixed parameters (no other per-call state: the runtime's bound layers). The runtime
    passes the same arrays on every compute of a context (its bound views; IO operands are new views
    each time and take the full path); replaying skips the Python that derived the loops' arguments
    (~5-25 us a layer: 0.3-0.4 ms of MobileNetV2's or EfficientNet-B0's batch-1 run on 2 threads).
    Recorded at the second call, not the first: by then every layer of the program has grown its
    scratch slots once, so the recorded scratch views are the buffers in use. A recording that holds
    a parallel_for / parallel_range (None) or no loop at all is never replayed; one whose operands
    change (an instruction on the program's IO) is dropped, and that call site is not recorded
    again (nor are its operands kept alive)."""
    state = [(), None, 0]     # operands of the recorded call, its task loops, calls so far (-1: never record)
    is_ = operator.is_

    def fn(*operands):
        if not REPLAY:
            run(*operands)
            return
        rec = state[1]
        if rec is not None:
            if len(operands) == len(state[0]) and all(map(is_, operands, state[0])):
                _REGIONS["replayed"] += 1
                replay_regions(rec)
                return
            state[0], state[1], state[2] = (), None, -1
        if state[2] != 1:
            if state[2] == 0:
                state[2] = 1
            run(*operands)
            return
        state[2] = -1
        with capture_regions() as calls:
            run(*operands)
        if calls and None not in calls:
            state[0], state[1] = operands, tuple(calls)
    fn.replay_state = state
    return fn


def recorded(fn, operands) -> tuple | None:
    """The task loops a `replaying` wrapper `fn` replays when called with exactly these operand objects (what
    `fn(*operands)` would hand `replay_regions`), or None: not such a wrapper, nothing recorded yet, or recorded
    for other operands. The runtime strings such recordings together (runtime/session.py: a context's flat
    plan)."""
    state = getattr(fn, "replay_state", None)
    if state is None or state[1] is None or len(operands) != len(state[0]):
        return None
    return state[1] if all(map(operator.is_, operands, state[0])) else None


def numba_region(par, seq, threads, ntasks: int, *args) -> int:
    """Run a task loop of `ntasks` tasks. `seq(counter, tid, *args)` is one worker: it takes tasks
    from counter[0] (an int64 array, atomically), or its own chunk first (conv/_nb.take), until none is
    left, with per-thread scratch row `tid` (< numba_max_threads()); `par(nt, *args)` runs nt such
    workers on numba's pool. With region_threads(threads, ntasks) <= 1: seq on the calling thread; on
    our pool (`region_plan`): that many seq workers; on numba's pool: region_threads(threads, any)
    workers, the same team width for every region of a session whatever its task count (fewer while
    other processes hold cores: `region_plan`). Which thread runs a task never changes its bits.
    Returns the thread count used."""
    if _LOCAL.capture is not None:
        _LOCAL.capture.append((par, seq, threads, ntasks, args))
    width = region_threads(threads, 1 << 30)
    nt = min(width, ntasks)
    if nt <= 1:
        _run_serial(seq, args)
        return 1
    # numba's pool runs the full width whatever the task count (the workers past the last task find
    # the counter spent and return): a region narrower than the one before shrinks the OpenMP team
    # and the next wide one must wake the parked threads. On the 16-core device machine a 1x1 layer
    # after a 14-task Winograd layer took 260-278 us against 157 us after a 16-task one, and the
    # classifier after the 2-task global pool 0.56-0.89 ms against 0.115 (benchmarks/RESULTS.md).
    mode, free = region_plan(width)       # judged at the width numba's pool would run
    if mode == "pool":
        _REGIONS["pool"] += 1
        from .conv._nb import new_counter      # (here: the conv modules import this one)
        counter = new_counter(nt)   # a fresh one per region: a late worker finds it spent
        _spread(lambda tid: seq(counter, tid, *args), nt)
        return nt
    if numba_layer() == "workqueue":
        with _NUMBA_LOCK:
            _run_numba(par, width, free, args)
    else:
        _run_numba(par, width, free, args)
    return free


def _run_serial(seq, args) -> None:
    """A task loop on the calling thread (one task or one thread): numba_region's and replay_regions' serial
    case."""
    _REGIONS["serial"] += 1
    seq(np.zeros(COUNTER_SLOTS, np.int64), 0, *args)


def _run_numba(par, width: int, free: int, args) -> None:
    """A task loop on numba's pool with `free` workers (`region_plan`'s answer for a team of `width`):
    numba_region's and replay_regions' common tail, so the two cannot drift apart."""
    _REGIONS["narrowed" if free < width else "numba"] += 1
    if _LOCAL.numba_nt != free:
        set_numba_threads(free)
    par(free, *args)


def set_numba_threads(n: int) -> None:
    """numba's per-thread count for this thread's next regions (a ctypes call: callers set it only on a change);
    a growth counts in `_LOCAL.team` (libgomp starts workers then: kernels/placement.py reads them again)."""
    _NUMBA["set"](n)
    if n > _LOCAL.numba_nt:
        _LOCAL.team += 1
    _LOCAL.numba_nt = n


def aligned_empty(n: int, dtype=np.float32, align: int = 64, zeros: bool = False) -> np.ndarray:
    """np.empty(n, dtype) (np.zeros with zeros=True) whose first element is on an `align`-byte
    boundary: numpy's large buffers start 16 bytes past a page, off every cache line, which splits
    64-byte loads. The one helper behind device arenas, constant areas, scratch and run outputs."""
    dt = np.dtype(dtype)
    raw = (np.zeros if zeros else np.empty)(n * dt.itemsize + align, np.uint8)
    off = -raw.ctypes.data % align
    return raw[off:off + n * dt.itemsize].view(dt)


def aligned(a: np.ndarray, align: int = 64) -> np.ndarray:
    """a itself if C-contiguous and on an `align`-byte boundary, else such a copy (benchmarks hand
    kernels the alignment a compiled network's device memory has)."""
    if a.flags.c_contiguous and a.ctypes.data % align == 0:
        return a
    out = aligned_empty(a.size, a.dtype, align).reshape(a.shape)
    out[...] = a
    return out


class Scratch:
    """Named, typed scratch buffers, grown on demand and reused (contents undefined)."""

    def __init__(self):
        self.bufs: dict[tuple[str, np.dtype], np.ndarray] = {}
        # (slot, dtype as passed, shape) -> the view `get` returned: a layer asks for the same view on
        # every call, and building it (dtype, key, slice, reshape) cost ~2.4 us a call on the
        # development VM's Python, a tenth of a 7x7 depthwise layer's kernel. Cleared when a buffer
        # is replaced.
        self._views: dict = {}

    def reserve(self, slot: str, nelem: int, dtype=np.float32) -> None:
        key = (slot, np.dtype(dtype))
        if key not in self.bufs or self.bufs[key].size < nelem:
            self.bufs[key] = aligned_empty(max(int(nelem), 1), dtype)
            self._views.clear()

    def get(self, slot: str, shape, dtype=np.float32) -> np.ndarray:
        """A view of `shape` (an int: 1-D) on the slot's buffer."""
        if isinstance(shape, list):
            shape = tuple(shape)
        vk = (slot, dtype, shape)
        v = self._views.get(vk)
        if v is not None:
            return v
        n = shape if isinstance(shape, int) else math.prod(shape)   # (np.prod: ~20 us a call)
        key = (slot, np.dtype(dtype))
        buf = self.bufs.get(key)
        if buf is None or buf.size < n:
            self.reserve(slot, n, dtype)
            buf = self.bufs[key]
        v = self._views[vk] = buf[:n].reshape(shape)
        return v

    @property
    def nbytes(self) -> int:
        return sum(b.nbytes for b in self.bufs.values())


def scratch(name: str, shape, dtype=np.float32) -> np.ndarray:
    """A per-thread buffer of `shape` (an int: 1-D), reused across calls of this thread (or the
    Scratch a `use_scratch` block gave this thread)."""
    s = getattr(_LOCAL, "scratch", None)
    if s is None:
        s = _LOCAL.scratch = Scratch()
    return s.get(name, shape, dtype)


class use_scratch:
    """with use_scratch(s): the kernels this thread calls take their `scratch` buffers from
    Scratch s. For callers that run kernels on short-lived threads (the stream mode's pipeline
    stages, one thread per stage and run): with a per-thread Scratch every run would allocate the
    buffers again (Winograd's: MiBs), and once glibc's dynamic mmap threshold has risen past
    their size they come from the brk heap, which keeps the pages: +7 MiB after the second run
    at VGG 4K pipe2 (benchmarks/RESULTS.md, 2026-11-26)."""

    def __init__(self, s: Scratch):
        self.s = s

    def __enter__(self) -> Scratch:
        self.prev = getattr(_LOCAL, "scratch", None)
        _LOCAL.scratch = self.s
        return self.s

    def __exit__(self, *exc) -> None:
        _LOCAL.scratch = self.prev


# the step thread count (training) -------------------------------------------------------------
# The training kernels take no `threads` argument: a step sets the count once for the thread it
# runs on (`using`), and every kernel it calls splits its tiles over that many threads of the pool.

class using:
    """with using(threads): kernels called in this thread split over `threads` threads
    (None: all cores, `resolve_threads`)."""

    def __init__(self, threads: int | None):
        self.n = resolve_threads(threads)

    def __enter__(self):
        self.old = getattr(_LOCAL, "threads", None)
        _LOCAL.threads = self.n
        return self

    def __exit__(self, *exc):
        _LOCAL.threads = self.old


def nthreads() -> int:
    """The thread count set by `using` in this thread; 1 outside."""
    return getattr(_LOCAL, "threads", None) or 1


def split(ntasks: int, fn) -> None:
    """fn(task, tid) for task in range(ntasks) over `nthreads()` threads of the pool."""
    parallel_range(ntasks, fn, nthreads())


def ranges(n: int, parts: int, align: int = 1):
    """Split range(n) into about `parts` contiguous [lo, hi) pieces (multiples of align)."""
    parts = max(1, min(parts, -(-n // align)))
    step = -(-n // parts)
    step = -(-step // align) * align
    return [(lo, min(n, lo + step)) for lo in range(0, n, step)]


def split_rows(n: int, fn, min_per_task: int = 1) -> None:
    """fn(lo, hi, tid) over ~2 pieces per thread of range(n) (`nthreads()` threads)."""
    t = nthreads()
    parts = 1 if t == 1 else min(2 * t, max(1, n // max(min_per_task, 1)))
    rs = ranges(n, parts)
    split(len(rs), lambda i, tid: fn(rs[i][0], rs[i][1], tid))


# OpenBLAS: its thread count lives with the rest of BLAS in kernels/blas.py (re-exported here
# for the kernels that limit it around their own parallel regions)
from .blas import blas_info, blas_threads  # noqa: E402,F401

_choose_early()
