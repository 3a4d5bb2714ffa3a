"""The ONNX backend node test cases of the installed onnx package, through from_onnx.

Every case of `onnx.backend.test.case.node` (collected from the onnx package's own case
definitions) must either pass or be refused with a tilefuse error at import: none may crash, and
none may give a result that differs from the case's expected outputs (at the case's own rtol/atol,
with the expected dtype). A case passes when tilefuse's reference evaluator reproduces the case's
outputs; the cases made only of ops in the importer's op table (`convert.RULES`) that pass are also
compiled and run through a Session and must match the same way.

Each case is tried in two ways: (a) non-float inputs (shapes, axes, flags) bound as constants, the
float inputs fed at run time; (b) every input but the first bound as a constant (weights fed as
inputs in the case: tilefuse compiles weights as constants). The case passes if a way passes; any
wrong or crashed way fails the test. The claimed op types come from the importer's own table
(`convert.RULES` for converted ops, `fold.FOLD` for ops folded on constants).
"""
from __future__ import annotations

import collections
import functools
import warnings

import numpy as np
import onnx
import pytest

import tilefuse
from tilefuse.errors import TilefuseError
from tilefuse.frontend.onnx_import import RULES, claimed_ops
from tilefuse.kernels.registry import KERNELS

# Ops whose node cases are all refused, and why (a claim with no passing case must be explained).
NO_PASSING_CASE = {
    "Dropout": "inference cases return the input unchanged (a graph output that is a graph input is refused); "
               "training cases are refused",
    "LayerNormalization": "every case also returns the Mean and InvStdDev outputs, which tilefuse does not "
                          "produce (refused by name)",
    "Greater": "every case returns the comparison's bool tensor as the graph output; tilefuse computes float "
                 "tensors and keeps a comparison for Where / Not / And / Or / Cast to read "
                 "(tests/test_where.py, against ONNX Runtime)",
    "LessOrEqual": "every case returns the comparison's bool tensor as the graph output; tilefuse computes float "
                 "tensors and keeps a comparison for Where / Not / And / Or / Cast to read "
                 "(tests/test_where.py, against ONNX Runtime)",
    "Or": "every case returns the comparison's bool tensor as the graph output; tilefuse computes float "
                 "tensors and keeps a comparison for Where / Not / And / Or / Cast to read "
                 "(tests/test_where.py, against ONNX Runtime)",
    "TopK": "every case returns the Indices output too, which tilefuse does not produce (refused by name); the "
            "Values against ONNX Runtime: tests/test_sort.py",
    "SplitToSequence": "every case takes or returns a sequence as a graph input / output; tilefuse takes and "
        "returns tensors and reads a sequence inside the graph (tests/test_onnx_sequences.py, against ONNX Runtime)",
    "SequenceAt": "every case takes or returns a sequence as a graph input / output; tilefuse takes and "
        "returns tensors and reads a sequence inside the graph (tests/test_onnx_sequences.py, against ONNX Runtime)",
    "SequenceConstruct": "every case takes or returns a sequence as a graph input / output; tilefuse takes and "
        "returns tensors and reads a sequence inside the graph (tests/test_onnx_sequences.py, against ONNX Runtime)",
    "ConcatFromSequence": "every case takes or returns a sequence as a graph input / output; tilefuse takes and "
        "returns tensors and reads a sequence inside the graph (tests/test_onnx_sequences.py, against ONNX Runtime)",
    "MaxUnpool": "every case takes the indices as a graph input; tilefuse unpools by the Indices of a MaxPool in the "
                 "graph, without an index tensor (tests/test_pooling_idioms.py, against ONNX Runtime)",
    "IsNaN": "every case returns the bool tensor as the graph output; tilefuse keeps it as a comparison for Where "
             "/ Not / And / Or / Cast to read (tests/test_infinite_compare.py, against ONNX Runtime)",
    "IsInf": "every case returns the bool tensor as the graph output; tilefuse keeps it as a comparison for Where "
             "/ Not / And / Or / Cast to read (tests/test_infinite_compare.py, against ONNX Runtime)",
}


@functools.lru_cache(maxsize=1)
def _cases() -> dict:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with np.errstate(all="ignore"):
            from onnx.backend.test.case.node import collect_testcases
            cases = collect_testcases(None)
    return {c.name: c for c in cases if c.kind == "node"}


def _names() -> list[str]:
    return sorted(_cases())


def _inputs(model, inputs, bind_all: bool):
    init = {t.name for t in model.graph.initializer}
    names = [vi.name for vi in model.graph.input if vi.name not in init]
    consts, feeds = {}, {}
    for k, (nm, v) in enumerate(zip(names, inputs)):
        if isinstance(v, (np.ndarray, np.generic)) and (v.dtype.kind != "f" or (bind_all and k > 0)):
            consts[nm] = np.asarray(v)
        else:
            feeds[nm] = v
    return consts, feeds


def _compare(ys, outputs, rtol, atol):
    assert len(ys) == len(outputs), f"{len(ys)} outputs, expected {len(outputs)}"
    for i, (y, e) in enumerate(zip(ys, outputs)):
        e = np.asarray(e)
        assert y.dtype == e.dtype, f"output {i} has dtype {y.dtype}, expected {e.dtype}"
        np.testing.assert_allclose(y, e, rtol=rtol, atol=atol, err_msg=f"output {i}")


def _try(case, bind_all: bool, compiled: bool = False):
    """('pass' | 'refused' | 'wrong' | 'crash', message) for one way of running a case."""
    for inputs, outputs in case.data_sets:
        consts, feeds = _inputs(case.model, inputs, bind_all)
        try:
            net = tilefuse.from_onnx(case.model, constants=consts)
        except TilefuseError as e:
            cause = e.__cause__
            if cause is not None and not isinstance(cause, (TilefuseError, onnx.checker.ValidationError)):
                return "crash", f"import wrapped {type(cause).__name__}: {e}"
            return "refused", str(e)
        except Exception as e:
            return "crash", f"import raised {type(e).__name__}: {e}"
        try:   # an imported graph must run: errors from here on are crashes
            if compiled:
                x = [feeds[d.name] for d in net.inputs]
                y = tilefuse.Session(tilefuse.compile(net)).run(x[0] if len(x) == 1 else x)
                ys = list(y) if isinstance(y, (list, tuple)) else [y]
            else:
                ys = tilefuse.evaluate(net, feeds)
        except Exception as e:
            return "crash", f"run raised {type(e).__name__}: {e}"
        try:
            _compare(ys, outputs, case.rtol, case.atol)
        except AssertionError as e:
            return "wrong", str(e)
    return "pass", ""


@functools.lru_cache(maxsize=None)
def _outcome(name: str):
    """(status, message, bind_all of the passing way) of a case: pass beats refused; wrong/crash win."""
    case = _cases()[name]
    tries = {b: _try(case, b) for b in (False, True)}
    for bad in ("crash", "wrong"):
        for b, (s, msg) in tries.items():
            if s == bad:
                return bad, msg, b
    for b, (s, msg) in tries.items():
        if s == "pass":
            return "pass", "", b
    return "refused", tries[False][1], False


@pytest.mark.parametrize("name", _names())
def test_node_case(name):
    status, msg, _ = _outcome(name)
    assert status in ("pass", "refused"), f"{name}: {status}: {msg}"


def _compiled_names() -> list[str]:
    out = []
    for name in _names():
        m = _cases()[name].model
        if all(n.op_type in RULES for n in m.graph.node) and any(n.op_type in RULES for n in m.graph.node):
            out.append(name)
    return out


@pytest.mark.parametrize("name", _compiled_names())
def test_node_case_compiled(name):
    """The cases that pass through the reference evaluator also pass compiled, through a Session."""
    status, _, bind_all = _outcome(name)
    case = _cases()[name]
    if status != "pass" or any(np.asarray(v).dtype != np.float32 for v in case.data_sets[0][0][:1]):
        return   # refused at import (checked above), or not a float32 case: the compiled path is float32
    consts, _ = _inputs(case.model, case.data_sets[0][0], bind_all)
    missing = sorted({o.op for o in tilefuse.from_onnx(case.model, constants=consts).ops} - set(KERNELS))
    if missing:
        pytest.skip(f"no CPU kernel yet for IR op(s) {missing}")
    status, msg = _try(case, bind_all, compiled=True)
    assert status == "pass", f"{name} compiled: {status}: {msg}"


def test_every_claimed_op_passes_a_case():
    """A claimed op with no passing node case is either listed in NO_PASSING_CASE (with the reason) or
    a gap the importer should not claim."""
    passed, seen = collections.Counter(), collections.Counter()
    for name in _names():
        ops = {n.op_type for n in _cases()[name].model.graph.node}
        status = _outcome(name)[0]
        for op in ops & set(RULES):
            seen[op] += 1
            passed[op] += status == "pass"
    missing = sorted(op for op in RULES if passed[op] == 0 and op not in NO_PASSING_CASE)
    assert not missing, f"claimed ops with no passing node case: {missing}"
    stale = sorted(op for op in NO_PASSING_CASE if passed[op] > 0 or op not in RULES)
    assert not stale, f"NO_PASSING_CASE lists ops that pass a case or are not claimed: {stale}"


def test_summary(capsys):
    """Counts by outcome (printed with -s); the claimed ops are the importer's table."""
    counts, claimed_counts = collections.Counter(), collections.Counter()
    claimed = set(claimed_ops())
    for name in _names():
        status = _outcome(name)[0]
        counts[status] += 1
        if {n.op_type for n in _cases()[name].model.graph.node} & claimed:
            claimed_counts[status] += 1
    with capsys.disabled():
        print(f"\nONNX node cases (onnx {onnx.__version__}): all {dict(counts)}; "
              f"with a claimed op {dict(claimed_counts)}")
    assert counts["wrong"] == 0 and counts["crash"] == 0
    assert counts["pass"] > 0
