"""The four execution modes of QingLong's evaluation (seed 002, section 4), for ablations.

  baseline  compile and copy the constants for every input (as DLPlib does)
  ql1       compile once; copy the constants for every input
  ql2       compile once; copy the constants once; inputs one after another
  ql3       compile once; copy the constants once; copy-in / compute / copy-out pipelined

Each mode's time covers compile + every constant copy + every input's copy-in, compute and
copy-out, as the paper measures it.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

from .compiler import compile as compile_net
from .ir import Network
from .runtime import CPUDevice, Session

MODES = ("baseline", "ql1", "ql2", "ql3")


@dataclass
class ModeResult:
    mode: str
    seconds: float
    compile_seconds: float
    outputs: list


def run_mode(net: Network, inputs, mode: str, device: CPUDevice | None = None, depth: int = 3,
             **compile_options) -> ModeResult:
    if mode not in MODES:
        raise ValueError(f"mode '{mode}' is not one of {MODES}")
    dev = device or CPUDevice()
    outs = []
    t0 = time.perf_counter()
    tc = 0.0
    if mode == "baseline":
        for x in inputs:
            t = time.perf_counter()
            compiled = compile_net(net, **compile_options)
            tc += time.perf_counter() - t
            sess = Session(compiled, dev)
            sess.copy_constants()
            outs.append(sess.run(x))
            sess.release()
    else:
        t = time.perf_counter()
        compiled = compile_net(net, **compile_options)
        tc = time.perf_counter() - t
        if mode == "ql1":
            for x in inputs:
                sess = Session(compiled, dev)
                sess.copy_constants()
                outs.append(sess.run(x))
                sess.release()
        else:
            sess = Session(compiled, dev)
            sess.copy_constants()
            if mode == "ql2":
                outs = [sess.run(x) for x in inputs]
            else:
                outs = sess.run_many(inputs, depth=depth)
            sess.release()
    return ModeResult(mode, time.perf_counter() - t0, tc, outs)
