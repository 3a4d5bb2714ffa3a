"""What one worker does with a batch of inputs: no Ray here, so `--workers 0` and every Ray
actor run the same code.

    runner = BatchRunner(package, threads=1)        # Session: constants copied once, kernels warmed
    results, busy = runner.run_batch(start, items)  # per item: its output, or an InputFailure

An item fails by itself (a bad shape, an image that does not decode) without taking the others
down: the batch runs through `Session.run_many`; if that raises, the items run one at a time with
`Session.run` so the failure is pinned to its index. `samples=True` means each item is one sample
without the batch dimension; samples are stacked into the package's batch (the last chunk padded
with zeros) and each sample gets its own row of the output back (`run_samples`).
"""
from __future__ import annotations

import hashlib
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from ..compiler.package import DataPackage, from_bytes, load_package, to_bytes
from ..errors import GraphError, TilefuseError
from ..runtime import Session


@dataclass(frozen=True)
class InputFailure:
    """Input `index` failed by itself; `error` says how ("GraphError: x: input has shape ...")."""
    index: int
    error: str

    def __str__(self) -> str:
        return f"input {self.index}: {self.error}"


class DistributedError(TilefuseError, RuntimeError):
    """A distributed run could not finish: Ray missing, workers lost past the retry limit."""


class InputErrors(DistributedError):
    """Some inputs failed by themselves; every other input completed.

    `failures`: the InputFailure of each failed input, by index; `results`: every result in
    input order, with the InputFailure in the failed places.
    """

    def __init__(self, failures: Sequence[InputFailure], results: list):
        self.failures = list(failures)
        self.results = results
        shown = "; ".join(str(f) for f in self.failures[:5])
        more = f" (and {len(self.failures) - 5} more)" if len(self.failures) > 5 else ""
        super().__init__(f"{len(self.failures)} of {len(results)} inputs failed, the others completed: "
                         f"{shown}{more}")


def describe_error(e: BaseException) -> str:
    return f"{type(e).__name__}: {e}"


# ----------------------------------------------------------------------------- packages

def package_blob(package) -> tuple[bytes, DataPackage]:
    """The package as .tfpkg bytes (what travels) and as a validated DataPackage.

    Takes a DataPackage, a compiled network, .tfpkg bytes or a path to a .tfpkg file. Bytes and
    files are validated here, in the caller's process, so a damaged package fails once and early
    instead of in every worker.
    """
    pkg = getattr(package, "package", package)
    if isinstance(pkg, DataPackage):
        return to_bytes(pkg), pkg
    if isinstance(pkg, (bytes, bytearray, memoryview)):
        data = bytes(pkg)
        return data, from_bytes(data, "<package bytes>")
    if isinstance(pkg, (str, os.PathLike)):
        p = load_package(pkg)
        return Path(pkg).read_bytes(), p
    raise TypeError(f"expected a DataPackage, a compiled network, .tfpkg bytes or a path, "
                    f"got {type(package).__name__}")


def package_digest(data) -> str:
    return hashlib.sha256(memoryview(data)).hexdigest()[:16]


# ----------------------------------------------------------------------------- samples

def sample_slot(pkg: DataPackage):
    """The one input a sample-wise run feeds: (slot, samples per model input)."""
    if len(pkg.inputs) != 1 or not pkg.inputs[0].shape:
        raise GraphError(pkg.name, f"sample-wise runs need one input with a batch dimension, the package "
                                   f"has {len(pkg.inputs)} inputs "
                                   f"({', '.join(f'{s.name} {tuple(s.shape)}' for s in pkg.inputs)})")
    slot = pkg.inputs[0]
    return slot, int(slot.shape[0])


def check_sample(pkg: DataPackage, x) -> np.ndarray:
    """One sample: the package input's shape without its batch dimension, castable dtype."""
    slot, _ = sample_slot(pkg)
    a = np.asarray(x)
    want = tuple(slot.shape[1:])
    if a.shape != want:
        raise GraphError(slot.name, f"sample has shape {a.shape}, expected {want} "
                                    f"(the package's input is {tuple(slot.shape)})")
    dt = np.dtype(slot.dtype)
    if a.dtype != dt:
        if not np.can_cast(a.dtype, dt, casting="same_kind"):
            raise GraphError(slot.name, f"sample has dtype {a.dtype}, expected {dt}")
        a = a.astype(dt)
    return a


def run_samples(session: Session, samples: Sequence[np.ndarray], depth: int = 3) -> list:
    """Stack samples into the package's batch N (last chunk zero-padded), run the chunks through
    the pipeline, return each sample's row of every output (one array, or a list per output)."""
    pkg = session.package
    slot, n = sample_slot(pkg)
    xs = [check_sample(pkg, s) for s in samples]
    chunks = []
    for i in range(0, len(xs), n):
        part = xs[i:i + n]
        chunk = np.zeros(slot.shape, np.dtype(slot.dtype))    # (N, *sample shape)
        chunk[:len(part)] = np.stack(part)
        chunks.append(chunk)
    if not chunks:
        return []
    ys = session.run_many(chunks, depth=depth) if len(chunks) > 1 else [session.run(chunks[0])]
    out = []
    for k in range(len(xs)):
        y = ys[k // n]
        j = k % n
        out.append([o[j] for o in y] if isinstance(y, list) else y[j])   # (N, ...) -> (...)
    return out


# ----------------------------------------------------------------------------- the runner

class BatchRunner:
    """One Session on one package, running batches of items; what a worker holds."""

    def __init__(self, package, threads: int | None = None, depth: int = 3, samples: bool = False,
                 preprocess: Callable[[Any], Any] | None = None,
                 postprocess: Callable[[Any], Any] | None = None, warmup: bool = True):
        t = time.perf_counter()
        if isinstance(package, np.ndarray):          # from Ray's object store: a read-only uint8 view
            package = memoryview(package).cast("B")
        self.digest = package_digest(package) if isinstance(package, (bytes, memoryview)) else None
        _, pkg = package_blob(package)
        if self.digest is None:
            self.digest = package_digest(to_bytes(pkg))
        self.session = Session(pkg, threads=threads)
        self.session.copy_constants()
        if samples:
            sample_slot(pkg)                         # fail now, not on every batch
        if warmup:
            self.session.warmup()
        self.depth, self.samples = depth, samples
        self.preprocess, self.postprocess = preprocess, postprocess
        self.load_seconds = time.perf_counter() - t
        self.batches = self.items = 0
        self.busy_seconds = 0.0

    def _run(self, xs: list) -> list:
        if self.samples:
            return run_samples(self.session, xs, self.depth)
        if len(xs) == 1:
            return [self.session.run(xs[0])]
        return self.session.run_many(xs, depth=self.depth)

    def run_batch(self, start: int, items: Sequence[Any]) -> tuple[list, float]:
        """Results for items start, start+1, ...: each its (post-processed) output or an
        InputFailure; and the seconds this took."""
        t = time.perf_counter()
        results: list = [None] * len(items)
        ok: list[tuple[int, Any]] = []
        for k, item in enumerate(items):
            try:
                x = self.preprocess(item) if self.preprocess is not None else item
                if self.samples:
                    x = check_sample(self.session.package, x)
                ok.append((k, x))
            except Exception as e:
                results[k] = InputFailure(start + k, describe_error(e))
        try:
            ys = self._run([x for _, x in ok])
        except Exception:
            ys = []                                  # pin the failure on its input: one at a time
            for k, x in ok:
                try:
                    ys.append(self._run([x])[0])
                except Exception as e:
                    ys.append(InputFailure(start + k, describe_error(e)))
        for (k, _), y in zip(ok, ys):
            if not isinstance(y, InputFailure) and self.postprocess is not None:
                try:
                    y = self.postprocess(y)
                except Exception as e:
                    y = InputFailure(start + k, describe_error(e))
            results[k] = y
        dt = time.perf_counter() - t
        self.batches += 1
        self.items += len(items)
        self.busy_seconds += dt
        return results, dt
