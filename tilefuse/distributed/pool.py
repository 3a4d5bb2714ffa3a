"""A pool of Ray actors, each holding one Session: constants copied once per worker.

    from tilefuse.distributed import Pool, run_many
    ys = run_many(package, xs, workers=4, batch=16, threads_per_worker=1)   # outputs in input order

    with Pool(package, workers=4, address="auto") as pool:   # a running cluster, or ray:// client
        for i, y in pool.imap(frames, batch=8):               # lazily, in input order
            ...
        print(pool.stats.summary())                           # per-worker throughput, restarts

The package travels once: `Pool` puts its .tfpkg bytes into Ray's object store once
(`stats.package_puts`) and hands every actor the same reference. Ray keeps one copy per node in
shared memory; each actor validates it and copies the constants to its own device once, then
only inputs and outputs move. Work goes out in batches of `batch` inputs with a bounded window
(`window` batches submitted but not yet yielded), so an input iterator of any length is read
only as fast as results come back.

Faults: an actor that dies (killed, out of memory, its node gone) is replaced by a new one on
the same package reference, and each call it had not finished is sent again; the inputs of the
call it was running become suspects and run one at a time, alone on a worker, so an input that
takes down its worker more than `max_retries` times is caught and ends the run with
`WorkerLost` naming it. An input that fails by itself (bad shape, bad dtype, an image that does
not decode) becomes an `InputFailure` with its index while every other input completes; at the
end `run_many` raises `InputErrors` listing them (or, with errors="return", leaves each
InputFailure in its place). Each input's result is delivered exactly once.

Ray is imported here only, on first use; `import tilefuse` never imports it.
"""
from __future__ import annotations

import collections
import os
import re
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Iterator

import numpy as np

from ..runtime.stages import Progress
from .runner import BatchRunner, DistributedError, InputErrors, InputFailure, package_blob, package_digest

RAY_HINT = "install it with: pip install 'tilefuse[distributed]'"


def import_ray():
    """Ray, or a DistributedError saying how to get it."""
    try:
        import ray
    except ImportError as e:
        raise DistributedError(f"tilefuse.distributed needs Ray, which is not installed ({e}); "
                               f"{RAY_HINT}") from None
    return ray


class WorkerLost(DistributedError):
    """Workers kept dying while running the same input: the retry limit ended the run."""


def connect(address: str | None = None, **init_options) -> bool:
    """Connect this process to Ray unless it already is. Returns True when it called ray.init.

    address: None -> RAY_ADDRESS or a cluster already running on this machine, else start a
    local one; "local" -> always start a local one; "auto" -> the running cluster (error if
    none); "ray://host:10001" -> through Ray Client. `init_options` go to `ray.init` (a local
    cluster gets include_dashboard=False unless they say otherwise).
    """
    ray = import_ray()
    if ray.is_initialized():
        return False
    opts = dict(init_options)
    if address in (None, "local"):
        opts.setdefault("include_dashboard", False)
    opts.setdefault("logging_level", "WARNING")
    try:
        ray.init(address=address, **opts)
    except ConnectionError as e:
        hint = ("" if os.environ.get("RAY_AUTH_MODE") else
                "; a cluster started with `ray start` (Ray >= 2.59) takes drivers with RAY_AUTH_MODE=token "
                "and its token (~/.ray/auth_token or RAY_AUTH_TOKEN) in their environment")
        raise DistributedError(f"cannot connect to the Ray cluster at {address}: {e}{hint}") from None
    return True


def put_package(package):
    """Put a package's .tfpkg bytes into Ray's object store once; returns the ObjectRef.

    The bytes go in as a uint8 array, so the workers of a node map one shared copy (zero-copy
    reads); each worker validates them (`from_bytes`) before use: no pickle of the package.
    """
    ray = import_ray()
    blob, _ = package_blob(package)
    connect()
    return ray.put(np.frombuffer(blob, dtype=np.uint8))



def _own(x):
    """A private copy of an input taken from the caller's iterator: the producer may reuse its
    array for the next item (a decoder's frame buffer) while this one still waits to be sent, or
    to be sent again after a worker died."""
    if isinstance(x, np.ndarray):
        return x.copy()
    if isinstance(x, (list, tuple)):
        return type(x)(a.copy() if isinstance(a, np.ndarray) else a for a in x)
    return x

@dataclass
class WorkerStats:
    name: str                 # w0, w1, ...; a replacement of w1 is w1.r1
    items: int = 0
    batches: int = 0
    busy_seconds: float = 0.0  # inside the actor: preprocess, run, postprocess
    load_seconds: float | None = None  # package validated, constants copied, kernels warmed
    node: str = ""
    pid: int | None = None
    died: str | None = None   # why it was replaced

    @property
    def items_per_second(self) -> float:
        return self.items / self.busy_seconds if self.busy_seconds > 0 else 0.0


@dataclass
class RunStats:
    package_puts: int = 0      # ray.put calls of the package (one per Pool, whatever happens)
    package_bytes: int = 0
    package_digest: str = ""
    items: int = 0             # results delivered (outputs and failures)
    failures: int = 0          # InputFailure among them
    wall_seconds: float = 0.0
    restarts: int = 0          # actors replaced after dying
    resubmitted_items: int = 0  # inputs sent again because their worker died
    max_buffered: int = 0      # most inputs read from the iterator but not yet yielded
    workers: list[WorkerStats] = field(default_factory=list)

    def summary(self) -> str:
        rate = self.items / self.wall_seconds if self.wall_seconds > 0 else 0.0
        lines = [f"{self.items} inputs in {self.wall_seconds:.2f} s ({rate:.1f}/s), {self.failures} failed; "
                 f"package put {self.package_puts}x ({self.package_bytes / 2**20:.2f} MiB) for the pool; "
                 f"{self.restarts} workers replaced, {self.resubmitted_items} inputs re-sent; "
                 f"at most {self.max_buffered} inputs held"]
        for w in self.workers:
            load = f", loaded in {w.load_seconds:.2f} s" if w.load_seconds is not None else ""
            where = f" on {w.node} pid {w.pid}" if w.pid is not None else ""
            dead = f" [died: {w.died}]" if w.died else ""
            lines.append(f"  {w.name}{where}: {w.items} inputs in {w.batches} batches, "
                         f"{w.items_per_second:.1f}/s busy{load}{dead}")
        return "\n".join(lines)


class _Worker:
    """The actor: one BatchRunner (one Session) for its whole life."""

    def __init__(self, package_blob, threads, depth, samples, preprocess, postprocess):
        import os
        import ray
        self.runner = BatchRunner(package_blob, threads=threads, depth=depth, samples=samples,
                                  preprocess=preprocess, postprocess=postprocess)
        node = f"{ray.util.get_node_ip_address()}/{ray.get_runtime_context().get_node_id()[:6]}"
        self._info = {"pid": os.getpid(), "node": node,                 # IP/node id (nodes may share an IP)
                      "digest": self.runner.digest, "load_seconds": self.runner.load_seconds}

    def info(self) -> dict:
        return dict(self._info, batches=self.runner.batches, items=self.runner.items)

    def run_batch(self, start, items):
        return self.runner.run_batch(start, items)


@dataclass
class _Task:
    start: int
    items: list
    attempts: int = 0          # times a worker died while running it
    seq: int = 0               # submission order (an actor runs its tasks in this order)


class _Slot:
    def __init__(self, name: str, actor, info_ref):
        self.name, self.actor, self.info_ref = name, actor, info_ref
        self.running: dict = {}    # ObjectRef -> _Task, in submission order
        self.dead = False
        self.stats = WorkerStats(name)


class Pool:
    """`workers` Ray actors on one package; see the module docstring."""

    def __init__(self, package, workers: int = 2, threads_per_worker: int | None = 1, *,
                 address: str | None = None, depth: int = 3, samples: bool = False,
                 preprocess: Callable | None = None, postprocess: Callable | None = None,
                 max_retries: int = 3, tasks_per_worker: int = 2, start_timeout: float = 300.0,
                 init_options: dict | None = None):
        if not isinstance(workers, int) or workers < 1:
            raise ValueError(f"workers must be a positive integer, got {workers!r}")
        if threads_per_worker is not None and (not isinstance(threads_per_worker, int) or threads_per_worker < 1):
            raise ValueError(f"threads_per_worker must be a positive integer or None, got {threads_per_worker!r}")
        if max_retries < 0 or tasks_per_worker < 1:
            raise ValueError(f"max_retries must be >= 0 and tasks_per_worker >= 1, "
                             f"got {max_retries} and {tasks_per_worker}")
        ray = self._ray = import_ray()
        blob, pkg = package_blob(package)        # validated here, once
        self.package = pkg
        connect(address, **(init_options or {}))
        cpus = threads_per_worker or 1
        have = ray.cluster_resources().get("CPU", 0)
        if workers * cpus > have:
            raise DistributedError(f"{workers} workers x {cpus} CPUs = {workers * cpus} CPUs asked, the Ray "
                                   f"cluster has {have:g}; use fewer workers or threads, or add nodes")
        self.workers, self.max_retries, self.tasks_per_worker = workers, max_retries, tasks_per_worker
        self.stats = RunStats(package_bytes=len(blob), package_digest=package_digest(blob))
        # the one copy that travels (see put_package)
        self._package_ref = ray.put(np.frombuffer(blob, dtype=np.uint8))
        self.package_puts = self.stats.package_puts = 1
        self._actor_cls = ray.remote(_Worker).options(
            num_cpus=cpus, max_restarts=0, max_task_retries=0, scheduling_strategy="SPREAD")
        self._args = (threads_per_worker, depth, samples, preprocess, postprocess)
        self._slots: list[_Slot] = []
        self._closed = False
        self._busy = False
        self._replaced = 0
        try:
            for i in range(workers):
                self._slots.append(self._start(f"w{i}"))
            self._wait_ready(start_timeout)
        except BaseException:
            self.close()
            raise

    # ------------------------------------------------------------------ actors

    def _start(self, name: str) -> _Slot:
        actor = self._actor_cls.remote(self._package_ref, *self._args)
        slot = _Slot(name, actor, actor.info.remote())
        self.stats.workers.append(slot.stats)
        return slot

    def _wait_ready(self, timeout: float) -> None:
        ray = self._ray
        refs = [s.info_ref for s in self._slots]
        ready, _ = ray.wait(refs, num_returns=len(refs), timeout=timeout)
        if len(ready) < len(refs):
            raise DistributedError(f"{len(refs) - len(ready)} of {len(refs)} workers not started after "
                                   f"{timeout:g} s (cluster resources: {ray.cluster_resources()})")
        for s in self._slots:
            try:
                self._note_info(s, ray.get(s.info_ref))
            except ray.exceptions.RayError as e:
                raise DistributedError(f"worker {s.name} failed to start: {_cause(e)}") from None

    def _note_info(self, slot: _Slot, info: dict) -> None:
        slot.stats.pid, slot.stats.node = info["pid"], info["node"]
        slot.stats.load_seconds = info["load_seconds"]
        if info["digest"] != self.stats.package_digest:
            raise DistributedError(f"worker {slot.name} loaded package {info['digest']}, expected "
                                   f"{self.stats.package_digest}")

    def _replace(self, slot: _Slot, why: str) -> _Slot:
        slot.dead = True
        slot.stats.died = why
        try:
            self._ray.kill(slot.actor, no_restart=True)
        except Exception:
            pass
        base = slot.name.split(".")[0]
        self.stats.restarts += 1
        self._replaced += 1
        new = self._start(f"{base}.r{self._replaced}")
        self._slots[self._slots.index(slot)] = new
        return new

    @property
    def actors(self) -> list:
        """The live actor handles (tests kill one with ray.kill)."""
        return [s.actor for s in self._slots]

    def close(self) -> None:
        """Kill the actors (the package reference is dropped with the pool)."""
        if self._closed:
            return
        self._closed = True
        for s in self._slots:
            try:
                self._ray.kill(s.actor, no_restart=True)
            except Exception:
                pass
        self._slots = []
        self._package_ref = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # ------------------------------------------------------------------ running

    def imap(self, inputs: Iterable[Any], batch: int = 16, window: int | None = None,
             progress: bool = False, total: int | None = None) -> Iterator[tuple[int, Any]]:
        """Yield (index, result) in input order; a result is the output (post-processed) or an
        InputFailure. At most `window` batches (default 3 per worker) are read from `inputs`
        and not yet yielded."""
        if self._closed:
            raise DistributedError("the pool is closed")
        if not isinstance(batch, int) or batch < 1:
            raise ValueError(f"batch must be a positive integer, got {batch!r}")
        window = window or (self.tasks_per_worker + 1) * self.workers
        if window < 1:
            raise ValueError(f"window must be >= 1 batch, got {window}")
        return self._imap(inputs, batch, window, progress, total)

    def _imap(self, inputs, batch: int, window: int, progress: bool, total: int | None):
        if self._busy:
            raise DistributedError("this pool is already running inputs: one run at a time per pool")
        self._busy = True
        ray = self._ray
        st = self.stats = RunStats(self.package_puts, self.stats.package_bytes, self.stats.package_digest)
        for s in self._slots:                      # this run's counts, the workers' identity kept
            s.stats = WorkerStats(s.name, load_seconds=s.stats.load_seconds, node=s.stats.node,
                                  pid=s.stats.pid)
            st.workers.append(s.stats)
        if total is None and hasattr(inputs, "__len__"):
            total = len(inputs)
        bar = Progress(total, "tilefuse batch") if progress else None
        source = iter(inputs)
        exhausted = False
        read = 0                                   # inputs taken from the iterator
        next_out = 0                               # next index to yield
        seq = 0
        retry: collections.deque[_Task] = collections.deque()     # to send again as they are
        suspects: collections.deque[_Task] = collections.deque()  # single inputs a worker died under
        owner: dict = {}                           # ObjectRef -> slot
        done: dict[int, list] = {}                 # start index -> results, waiting for their turn
        t0 = time.perf_counter()

        def submit(slot: _Slot, task: _Task) -> None:
            nonlocal seq
            ref = slot.actor.run_batch.remote(task.start, task.items)
            task.seq, seq = seq, seq + 1
            slot.running[ref] = task
            owner[ref] = slot

        def next_task() -> _Task | None:
            nonlocal read, exhausted
            if retry:
                return retry.popleft()
            if exhausted or read - next_out + batch > window * batch:
                return None
            items = []
            for x in source:
                items.append(_own(x))     # kept until its results return (retries resend it)
                if len(items) == batch:
                    break
            if len(items) < batch:
                exhausted = True
            if not items:
                return None
            task = _Task(read, items)
            read += len(items)
            st.max_buffered = max(st.max_buffered, read - next_out)
            return task

        def place() -> None:
            """Suspects (inputs whose worker died under them) run alone on an idle worker, so a
            death there is theirs; one worker drains for them while they wait. Other work fills
            the remaining workers up to tasks_per_worker calls each."""
            while True:
                reserved = None
                if suspects:
                    idle = [s for s in self._slots if not s.running]
                    if idle:
                        submit(idle[0], suspects.popleft())
                        continue
                    reserved = min(self._slots, key=lambda s: len(s.running))
                open_ = [s for s in self._slots if s is not reserved and len(s.running) < self.tasks_per_worker
                         and not any(t.attempts for t in s.running.values())]
                if not open_:
                    return
                task = next_task()
                if task is None:
                    return
                submit(min(open_, key=lambda s: len(s.running)), task)

        def accept(slot: _Slot, task: _Task, results: list, busy: float) -> None:
            if len(results) != len(task.items):
                raise DistributedError(f"worker {slot.name} returned {len(results)} results for "
                                       f"{len(task.items)} inputs at {task.start}")
            if task.start in done or task.start < next_out:     # cannot happen: one ref per task
                raise DistributedError(f"inputs at {task.start} came back twice")
            done[task.start] = results
            slot.stats.items += len(results)
            slot.stats.batches += 1
            slot.stats.busy_seconds += busy

        def collect(slot: _Slot, ref, task: _Task):
            """Take a finished call's results; return the Ray error if its worker is gone."""
            try:
                results, busy = ray.get(ref)
            except ray.exceptions.RayTaskError as e:
                # the call itself raised (an input that cannot even be unpickled there)
                if len(task.items) > 1:
                    retry.extend(_Task(task.start + k, [x], task.attempts) for k, x in enumerate(task.items))
                else:
                    done[task.start] = [InputFailure(task.start, f"could not run on the worker: {_cause(e)}")]
                return None
            except ray.exceptions.RayError as e:            # the worker died, or its node
                return e
            accept(slot, task, results, busy)
            return None

        def worker_died(slot: _Slot, ref, err) -> None:
            """Replace the worker. Calls that had finished keep their results; the oldest
            unfinished one (an actor runs its calls in order) is blamed: its inputs become
            suspects, each run alone on an idle worker (see place), so a later death is pinned
            on the input that caused it; calls queued behind it go again as they were. (Ray may
            unpack a queued call's arguments early, so the first blame can fall on the wrong
            call; quarantine sorts that out at the cost of one more death.)"""
            why = _cause(err)
            self._replace(slot, why)
            pending = sorted(slot.running.items(), key=lambda kv: kv[1].seq)
            slot.running.clear()
            blamed = False
            for r, task in pending:
                owner.pop(r, None)
                e = err if r == ref else collect(slot, r, task)
                if e is None:
                    continue
                st.resubmitted_items += len(task.items)
                if blamed:
                    retry.append(task)
                    continue
                blamed = True
                if task.attempts + 1 > self.max_retries:
                    what = (f"input {task.start}" if len(task.items) == 1 else
                            f"inputs {task.start}..{task.start + len(task.items) - 1}")
                    raise WorkerLost(
                        f"{what} {'was' if len(task.items) == 1 else 'were'} running on a worker that died "
                        f"{task.attempts + 1} times (last: {why}); giving up after max_retries="
                        f"{self.max_retries}. Inputs 0..{next_out - 1} were delivered")
                suspects.extend(_Task(task.start + k, [x], task.attempts + 1) for k, x in enumerate(task.items))

        try:
            while True:
                place()
                if not owner:
                    break
                ready, _ = ray.wait(list(owner), num_returns=1, timeout=1.0)
                for ref in ready:
                    slot = owner.pop(ref, None)
                    if slot is None:                 # taken with its dead worker's other calls
                        continue
                    task = slot.running.pop(ref)
                    err = collect(slot, ref, task)
                    if err is not None:
                        slot.running[ref] = task
                        worker_died(slot, ref, err)
                    elif slot.stats.pid is None:
                        try:
                            self._note_info(slot, ray.get(slot.info_ref))
                        except ray.exceptions.RayError:
                            pass
                while next_out in done:
                    results = done.pop(next_out)
                    st.items += len(results)
                    st.failures += sum(isinstance(r, InputFailure) for r in results)
                    st.wall_seconds = time.perf_counter() - t0
                    if bar:
                        bar.update(len(results))
                    for r in results:
                        yield next_out, r
                        next_out += 1
        finally:
            st.wall_seconds = time.perf_counter() - t0
            self._busy = False
            for ref in owner:                      # stopped early: drop what is still queued
                try:
                    ray.cancel(ref)
                except Exception:
                    pass
            for s in self._slots:
                s.running.clear()
            if bar:
                bar.close()

    def run_many(self, inputs: Iterable[Any], batch: int = 16, errors: str = "raise",
                 window: int | None = None, progress: bool = False) -> list:
        """Every input's result, in input order. errors="raise": after every input has run,
        raise InputErrors if some failed (its `.results` holds the rest); "return": leave each
        InputFailure in its place."""
        if errors not in ("raise", "return"):
            raise ValueError(f"errors must be 'raise' or 'return', got {errors!r}")
        results = [r for _, r in self.imap(inputs, batch=batch, window=window, progress=progress)]
        if errors == "raise":
            failures = [r for r in results if isinstance(r, InputFailure)]
            if failures:
                raise InputErrors(failures, results)
        return results


def _cause(e: BaseException) -> str:
    """A Ray error in one line: the type and first line of what went wrong (for a task error,
    of its cause: "RaySystemError: System error: cannot rebuild this input")."""
    cause = getattr(e, "cause", None)
    if isinstance(cause, BaseException) and cause is not e:
        e = cause
    text = re.sub(r"\x1b\[[0-9;]*m", "", str(e)).strip().splitlines()
    first = next((ln.strip() for ln in text if ln.strip()), "")
    return f"{type(e).__name__}: {first}"[:500]


def run_many(package, inputs: Iterable[Any], workers: int = 2, batch: int = 16,
             threads_per_worker: int | None = 1, *, address: str | None = None, errors: str = "raise",
             progress: bool = False, return_stats: bool = False, **pool_options):
    """Run every input through `workers` Ray actors; outputs in input order (see Pool).
    With return_stats=True: (outputs, RunStats)."""
    with Pool(package, workers, threads_per_worker, address=address, **pool_options) as pool:
        try:
            out = pool.run_many(inputs, batch=batch, errors=errors, progress=progress)
        finally:
            stats = pool.stats
    return (out, stats) if return_stats else out
