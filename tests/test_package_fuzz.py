"""Structure-aware package fuzzing: mutated packages with valid checksums either raise
PackageError when they load, or run and give the answer the package describes.

Each example takes one of the small packages of `fuzz_nets.py` (every runtime kernel, layout
and conv algorithm), applies one to three mutations to its decoded parts (header fields, the
program's instructions, parameters and operands, constant data, raw program bytes), re-encodes
it with recomputed CRC-32 and SHA-256 (anyone can), and loads it. A package that loads is run
by a Session on a bounded device and compared with `program_reference.run_reference`, a plain
interpreter of the same package that shares no code with the runtime's kernels. A crash fails
the test run, a hang trips the faulthandler guard, a wrong answer fails the comparison.
"""
from __future__ import annotations

import copy
import faulthandler
import struct

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tilefuse
from tilefuse.compiler.package import from_bytes
from tilefuse.compiler.program import CONST, DTYPES, HIDDEN, IO
from tilefuse.errors import OutOfDeviceMemory, PackageError
from tilefuse.runtime import CPUDevice, Session

from fuzz_nets import VARIANTS, compiled, inputs_for, join, split
from program_reference import run_reference

EXAMPLES = 2000
PACKAGES = {name: compiled(name)[1].package for name in VARIANTS}
STATS = {"examples": 0, "rejected": 0, "ran": 0, "too_big": 0}


# ----------------------------------------------------------------------------- mutations

INTS = [-9, -1, 0, 1, 2, 3, 4, 5, 7, 16, 64, 999, 99999, 2 ** 31, 2 ** 63 - 1]
WORDS = ["nchw", "nchwc", "direct", "gemm1x1", "winograd2", "winograd4", "im2col", "reference", "weight",
         "bias", "relu", "bogus", ""]
VALUES = st.one_of(st.sampled_from(INTS), st.booleans(), st.none(), st.sampled_from(WORDS),
                   st.floats(allow_nan=True, allow_infinity=True, width=32),
                   st.lists(st.sampled_from(INTS[:9]), min_size=1, max_size=4).map(tuple))
KERNEL_NAMES = ["conv2d", "relu", "add", "max_pool", "avg_pool", "global_avg_pool", "linear", "flatten",
                "softmax", "scale", "to_nchwc", "from_nchwc", "concat", "local_response_norm", "dropout",
                "batch_norm", "stream", "band", "nonexistent"]
KINDS = ["param", "param", "param", "shape", "shape", "dtype", "segment", "seg_offset", "block_offset",
         "name", "operands", "kernel", "instructions", "tags", "block", "block", "io", "io", "const_data",
         "const_data", "raw"]


def _dim(data, d):
    return data.draw(st.sampled_from([d + 1, max(d - 1, 1), d * 2, max(d // 2, 1), 16, 1, 3, 2 ** 20, 2 ** 40]))


def mutate(data, h, prog, area):
    """Apply one structure-aware mutation; returns a raw (position, byte) edit or None."""
    kind = data.draw(st.sampled_from(KINDS))
    ins = prog[data.draw(st.integers(0, len(prog) - 1))] if prog else None
    op = ins.operands[data.draw(st.integers(0, len(ins.operands) - 1))] if ins and ins.operands else None
    blocks, io = h["blocks"], h["io"]
    if kind == "param" and ins is not None:
        keys = sorted(ins.params) + ["threads", "layout", "weight_shape", "extra"]
        k = data.draw(st.sampled_from(keys))
        v = ins.params.get(k)
        if isinstance(v, tuple) and v and data.draw(st.booleans()):
            i = data.draw(st.integers(0, len(v) - 1))
            ins.params[k] = v[:i] + (data.draw(VALUES),) + v[i + 1:]
        elif data.draw(st.integers(0, 5)) == 0:
            ins.params.pop(k, None)
        else:
            ins.params[k] = data.draw(VALUES)
    elif kind == "shape" and op is not None:
        shape = list(op.shape)
        r = data.draw(st.integers(0, 3))
        if r == 0 and shape:
            shape.pop(data.draw(st.integers(0, len(shape) - 1)))
        elif r == 1:
            shape.insert(data.draw(st.integers(0, len(shape))), data.draw(st.sampled_from([1, 2, 16])))
        elif shape:
            i = data.draw(st.integers(0, len(shape) - 1))
            shape[i] = _dim(data, shape[i])
        op.shape = tuple(shape)
    elif kind == "dtype" and op is not None:
        op.dtype = data.draw(st.sampled_from(DTYPES))
    elif kind == "segment" and op is not None:
        op.segment = data.draw(st.sampled_from([CONST, HIDDEN, IO]))
        op.mode = data.draw(st.sampled_from([0, 1, int(op.segment == IO)]))
    elif kind == "seg_offset" and op is not None:
        offs = [b["offset"] for b in blocks] + [s["offset"] for s in io] + [0, 8, 64, 2 ** 40]
        op.seg_offset = data.draw(st.sampled_from(offs)) + data.draw(st.sampled_from([0, 0, 4, -4 if op.seg_offset >= 4 else 0]))
        op.seg_offset = max(op.seg_offset, 0)
    elif kind == "block_offset" and op is not None:
        op.block_offset = data.draw(st.sampled_from([2, 4, 6, 8, 64, 4096, 2 ** 40]))
    elif kind == "name" and op is not None:
        names = [b["name"] for b in blocks] + [s["name"] for s in io] + ["", "x\x1b[31m"]
        op.name = data.draw(st.sampled_from(names))
    elif kind == "operands" and ins is not None:
        r = data.draw(st.integers(0, 2))
        i, j = (data.draw(st.integers(0, len(ins.operands) - 1)) for _ in range(2))
        if r == 0:
            ins.operands[i], ins.operands[j] = ins.operands[j], ins.operands[i]
        elif r == 1 and len(ins.operands) > 1:
            ins.operands.pop(i)
        else:
            ins.operands.insert(i, copy.deepcopy(ins.operands[j]))
    elif kind == "kernel" and ins is not None:
        ins.kernel = data.draw(st.sampled_from(KERNEL_NAMES))
    elif kind == "instructions" and len(prog) > 1:
        r = data.draw(st.integers(0, 2))
        i, j = (data.draw(st.integers(0, len(prog) - 1)) for _ in range(2))
        if r == 0:
            prog[i], prog[j] = prog[j], prog[i]
        elif r == 1:
            prog.pop(i)
        else:
            prog.insert(i, copy.deepcopy(prog[j]))
    elif kind == "tags":
        k = data.draw(st.sampled_from(["const_bytes", "hidden_bytes", "io_bytes"]))
        v = h["tags"][k]
        h["tags"][k] = data.draw(st.sampled_from([v + 64, max(v - 64, 0), v * 2, 0, v + 8, 2 ** 40]))
    elif kind == "block" and blocks:
        b = blocks[data.draw(st.integers(0, len(blocks) - 1))]
        f = data.draw(st.sampled_from(["offset", "nbytes", "shape", "dtype", "name", "segment"]))
        if f in ("offset", "nbytes"):
            b[f] = data.draw(st.sampled_from([b[f] + 64, max(b[f] - 64, 0), b[f] + 4, 0, 2 ** 40]))
        elif f == "shape":
            i = data.draw(st.integers(0, len(b["shape"]) - 1))
            b["shape"][i] = _dim(data, b["shape"][i])
            if data.draw(st.booleans()):   # keep the byte size consistent with the new shape
                b["nbytes"] = int(np.prod(b["shape"])) * np.dtype(b["dtype"]).itemsize
        elif f == "dtype":
            b["dtype"] = data.draw(st.sampled_from([d.str for d in DTYPES]))
        elif f == "name":
            b["name"] = data.draw(st.sampled_from([x["name"] for x in blocks]))
        else:
            b["segment"] = "hidden" if b["segment"] == "const" else "const"
    elif kind == "io":
        s = io[data.draw(st.integers(0, len(io) - 1))]
        f = data.draw(st.sampled_from(["shape", "dtype", "name", "kind", "swap"]))
        if f == "shape":
            i = data.draw(st.integers(0, len(s["shape"]) - 1))
            s["shape"][i] = _dim(data, s["shape"][i])
        elif f == "dtype":
            s["dtype"] = data.draw(st.sampled_from([d.str for d in DTYPES]))
        elif f == "name":
            s["name"] = data.draw(st.sampled_from([x["name"] for x in io + blocks]))
        elif f == "kind":
            s["kind"] = "input" if s["kind"] == "output" else "output"
        elif len(io) > 1:
            io[0], io[-1] = dict(io[-1], offset=0), dict(io[0], offset=io[-1]["offset"])
    elif kind == "const_data":
        # (an earlier mutation may have moved a block out of the area or set its nbytes to 0: seed 61's 10,487th draw)
        # float32 weights, or int32 tables (a stream region's steps: layer, first row, end row)
        consts = [b for b in blocks if b["segment"] == "const" and np.dtype(b["dtype"]) in (np.float32, np.int32)
                  and b["nbytes"] >= 4 and b["offset"] + b["nbytes"] <= len(area)]
        if consts:
            b = consts[data.draw(st.integers(0, len(consts) - 1))]
            i = data.draw(st.integers(0, b["nbytes"] // 4 - 1))
            if np.dtype(b["dtype"]) == np.int32:
                v = data.draw(st.sampled_from([0, 1, -1, 2, 3, 5, 9, 2 ** 31 - 1, -2 ** 31]))
                struct.pack_into("<i", area, b["offset"] + 4 * i, v)
            else:
                v = data.draw(st.sampled_from([0.0, 1.0, -1.0, 100.0, -37.5, 1e-3, 3.0]))
                struct.pack_into("<f", area, b["offset"] + 4 * i, v)
    elif kind == "raw":
        return data.draw(st.integers(0, 2 ** 20)), data.draw(st.integers(0, 255))
    return None


# ----------------------------------------------------------------------------- the property

def check_mutated(blob: bytes):
    """PackageError at load, or a run equal to the reference interpretation of the package."""
    STATS["examples"] += 1
    try:
        pkg = from_bytes(blob)
    except PackageError:
        STATS["rejected"] += 1
        return
    if sum(int(np.prod(s.shape, dtype=object)) * np.dtype(s.dtype).itemsize for s in pkg.io) > 64 << 20:
        STATS["too_big"] += 1   # a valid package whose inputs / outputs alone exceed the test device
        return
    xs = inputs_for(pkg)
    sess = Session(pkg, CPUDevice(capacity_bytes=64 << 20), threads=1)
    try:
        sess.run(inputs_for(pkg, seed=1))   # a first run leaves its data in the hidden segment
        got = sess.run(xs)
    except OutOfDeviceMemory:
        STATS["too_big"] += 1   # a valid package larger than this device: a clear error
        return
    got = got if isinstance(got, list) else [got]
    want = run_reference(pkg, xs)
    STATS["ran"] += 1
    for s, a, b in zip(pkg.outputs, got, want):
        assert a.shape == b.shape and a.dtype == b.dtype, (s.name, a.shape, b.shape)
        b = b.astype(np.float64)
        scale = max(1.0, float(np.nanmax(np.abs(np.where(np.isfinite(b), b, 0)), initial=0)))
        ok = np.isclose(a, b, rtol=2e-3, atol=2e-3 * scale, equal_nan=True) | (np.isinf(b) & (a == b))
        assert ok.all(), f"output '{s.name}' differs from the reference interpretation: " \
                         f"max error {np.nanmax(np.abs(a - b))}, scale {scale}"


@settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
          suppress_health_check=list(HealthCheck))
@given(st.data())
def test_fuzz_structured_mutations(data):
    name = data.draw(st.sampled_from(sorted(PACKAGES)))
    h, prog, area = split(PACKAGES[name])
    raw = None
    for _ in range(data.draw(st.integers(1, 3))):
        raw = mutate(data, h, prog, area) or raw
    try:
        blob = join(h, prog, area, raw)
    except (struct.error, ValueError, OverflowError, TypeError, KeyError, IndexError):
        return   # the mutation cannot even be encoded (e.g. a dimension past u64)
    faulthandler.dump_traceback_later(120, exit=True)    # a hang fails the run with a traceback
    try:
        check_mutated(blob)
    finally:
        faulthandler.cancel_dump_traceback_later()


def test_fuzz_ran_enough():
    """The fuzz above really ran >= 2,000 mutated packages, and a good share loaded and ran."""
    if STATS["examples"] < EXAMPLES:
        test_fuzz_structured_mutations()
    assert STATS["examples"] >= EXAMPLES, STATS
    # the share that loads depends on the packages' structure, as the derandomized draws are read
    # against it (an operand count or a block size changes what every later draw means): 266 of
    # 2008 ran with the earlier prepared constants, 162-199 of 2000 (by hypothesis version) once
    # the stem got its own packed constants and the Winograd U its packed layout
    assert STATS["ran"] >= EXAMPLES * 3 // 40, STATS


@pytest.mark.parametrize("name", sorted(PACKAGES))
def test_unmutated_packages_match_the_reference(name):
    """The oracle itself: each fuzz package, re-encoded unchanged, loads and matches it."""
    h, prog, area = split(PACKAGES[name])
    check_mutated(join(h, prog, area))


def main(argv=None) -> int:
    """Longer runs than the suite's derandomized 2,000 draws: `python tests/test_package_fuzz.py --examples N
    --seed S [--save FILE]`; the first failure stops the run (its package's bytes go to FILE)."""
    import argparse
    import time

    from hypothesis import Phase
    from hypothesis import seed as hseed
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--examples", type=int, default=20000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--save", help="write a failing package here")
    a = ap.parse_args(argv)
    last = {}
    real = check_mutated

    def keep(blob):
        last["blob"] = blob
        return real(blob)

    globals()["check_mutated"] = keep
    run = hseed(a.seed)(settings(max_examples=a.examples, deadline=None, database=None, phases=[Phase.generate],
                                 suppress_health_check=list(HealthCheck))(given(st.data())(
        test_fuzz_structured_mutations.hypothesis.inner_test)))
    t0 = time.perf_counter()
    try:
        run()
    except Exception as e:
        if a.save and "blob" in last:
            with open(a.save, "wb") as f:
                f.write(last["blob"])
        print(f"seed {a.seed}: failing after {STATS['examples']} mutated packages: {type(e).__name__}: {str(e)[:1500]}")
        return 1
    print(f"seed {a.seed}: {STATS['examples']} mutated packages, {STATS['rejected']} refused at load, {STATS['ran']} "
          f"ran as the reference, {STATS['too_big']} larger than the device; 0 failing "
          f"({time.perf_counter() - t0:.0f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
