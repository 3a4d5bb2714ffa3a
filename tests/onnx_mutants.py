"""ONNX files tilefuse did not make: the random graphs of `onnx_graphs.py`, each mutated one to three times
the way a broken exporter, a hand edit or a hostile file would (attributes set to wild or wrongly typed values
or removed, initializers whose dims, data type or data do not agree, data said to live in an external file,
node inputs renamed, dropped or made circular, op types and domains swapped, graph input shapes and types
changed, opset and IR versions changed, and the serialized bytes flipped or cut short), then handed to
`from_onnx` as bytes, compiled and run on a bounded device (tests/test_onnx_mutants.py; longer runs: the
command line below).

tilefuse must either refuse the file with a TilefuseError (GraphError, UnsupportedOpError, OutOfDeviceMemory,
...) or compute it; any other exception (an IndexError, a numpy error, a KeyError from deep inside) is a
failure, as is a crash or a hang. Where tilefuse computes a mutant that ONNX Runtime also runs, the outputs are
compared as `onnx_graphs.check` compares them. Where tilefuse computes one ONNX Runtime refuses (ORT refuses
some files the spec allows: a dilated Conv with auto_pad, LRN with alpha <= 0), the outputs are compared with
ONNX's reference evaluator's; where that refuses too, the run counts it and prints the first few (`accepted`):
not a failure by itself, a list to read.

    .venv/bin/python tests/onnx_mutants.py --seconds 300 [--seed 1]
"""
from __future__ import annotations

import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import onnx_graphs  # noqa: E402

AS_LIMIT = 12 << 30           # the command line's address-space limit (bytes)
CAPACITY = 256 << 20          # the bounded device's bytes: a mutant past it is refused (OutOfDeviceMemory)
WILD_INTS = [-(2 ** 63), -(2 ** 31), -9, -2, -1, 0, 1, 2, 3, 4, 5, 7, 16, 255, 4096, 2 ** 31 - 1, 2 ** 31, 2 ** 62]
WILD_FLOATS = [float("nan"), float("inf"), float("-inf"), -1.0, -0.0, 0.0, 1e-45, 1e-30, 0.5, 1.0, 2.0, 1e30, 3e38]
WORDS = ["", "x", "NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID", "constant", "reflect", "edge", "wrap",
         "nearest", "linear", "cubic", "asymmetric", "half_pixel", "align_corners", "pytorch_half_pixel",
         "tf_crop_and_resize", "half_pixel_symmetric", "round_prefer_floor", "round_prefer_ceil", "floor", "ceil",
         "DCR", "CRD", "tanh", "none", "stretch", "not_larger", "not_smaller", "\u00e9\u0000", "a" * 300]
ATTR_NAMES = ["axis", "axes", "keepdims", "group", "pads", "strides", "kernel_shape", "dilations", "auto_pad",
              "mode", "alpha", "beta", "gamma", "epsilon", "perm", "transA", "transB", "ceil_mode", "size",
              "blocksize", "coordinate_transformation_mode", "nearest_mode", "output_padding", "output_shape",
              "split", "starts", "ends", "allowzero", "approximate", "min", "max", "to", "noop_with_empty_axes",
              "count_include_pad", "storage_order", "bias", "momentum", "training_mode", "stash_type", "value"]


def _mutate_attr(r, model) -> str | None:
    from onnx import AttributeProto, helper
    nodes = [n for n in model.graph.node if n.attribute]
    if not nodes:
        return None
    nd = nodes[int(r.integers(len(nodes)))]
    i = int(r.integers(len(nd.attribute)))
    a = nd.attribute[i]
    how = int(r.integers(5))
    if how == 0:
        del nd.attribute[i]
        return f"{nd.op_type}: removed {a.name}"
    if how == 1:                 # another type under the same name
        nd.attribute[i].CopyFrom(helper.make_attribute(a.name, [int(r.choice(WILD_INTS[4:12]))] * 2
                                                       if a.type == AttributeProto.INT else
                                                       float(r.choice(WILD_FLOATS)) if a.type != AttributeProto.FLOAT
                                                       else str(r.choice(WORDS))))
        return f"{nd.op_type}: {a.name} retyped"
    if a.type == AttributeProto.INT:
        a.i = int(r.choice(WILD_INTS))
    elif a.type == AttributeProto.INTS and len(a.ints):
        vals = list(a.ints)
        if r.random() < 0.4:
            vals = vals[:-1] if r.random() < 0.5 else vals + [int(r.choice(WILD_INTS))]
        else:
            vals[int(r.integers(len(vals)))] = int(r.choice(WILD_INTS))
        del a.ints[:]
        a.ints.extend(vals)
    elif a.type == AttributeProto.FLOAT:
        a.f = float(r.choice(WILD_FLOATS))
    elif a.type == AttributeProto.FLOATS and len(a.floats):
        a.floats[int(r.integers(len(a.floats)))] = float(r.choice(WILD_FLOATS))
    elif a.type == AttributeProto.STRING:
        a.s = str(r.choice(WORDS)).encode("utf-8", "surrogatepass")
    else:
        return None
    return f"{nd.op_type}: {a.name} set"


def _add_attr(r, model) -> str | None:
    from onnx import helper
    if not len(model.graph.node):
        return None
    nd = model.graph.node[int(r.integers(len(model.graph.node)))]
    name = str(r.choice(ATTR_NAMES))
    if any(a.name == name for a in nd.attribute):
        return None
    kind = int(r.integers(4))
    val = (int(r.choice(WILD_INTS[2:14])) if kind == 0 else [int(r.choice(WILD_INTS[2:14]))
                                                              for _ in range(int(r.integers(1, 5)))]
           if kind == 1 else float(r.choice(WILD_FLOATS)) if kind == 2 else str(r.choice(WORDS)))
    nd.attribute.append(helper.make_attribute(name, val))
    return f"{nd.op_type}: added {name}"


def _mutate_init(r, model) -> str | None:
    from onnx import TensorProto, numpy_helper
    inits = model.graph.initializer
    if not len(inits):
        return None
    t = inits[int(r.integers(len(inits)))]
    how = int(r.integers(7))
    if how == 0 and len(t.dims):     # dims that do not agree with the data
        j = int(r.integers(len(t.dims)))
        t.dims[j] = int(r.choice([0, 1, t.dims[j] + 1, max(t.dims[j] - 1, 0), 2 ** 31, -1]))
        return f"initializer {t.name}: dims {list(t.dims)}"
    if how == 1:                     # a dim added or dropped
        dims = list(t.dims)
        dims = dims[1:] if dims and r.random() < 0.5 else [1] + dims
        del t.dims[:]
        t.dims.extend(dims)
        return f"initializer {t.name}: dims {dims}"
    if how == 2:                     # another data type over the same bytes
        t.data_type = int(r.choice([TensorProto.DOUBLE, TensorProto.FLOAT16, TensorProto.INT64, TensorProto.INT32,
                                    TensorProto.INT8, TensorProto.BOOL, TensorProto.STRING, TensorProto.BFLOAT16,
                                    TensorProto.UINT8, TensorProto.COMPLEX64, 0, 99]))
        return f"initializer {t.name}: data_type {t.data_type}"
    if how == 3:                     # the data cut short (or one byte long)
        arr = numpy_helper.to_array(t)
        raw = arr.tobytes()
        t.ClearField("float_data")
        t.ClearField("int64_data")
        t.ClearField("int32_data")
        t.raw_data = raw[:int(r.integers(0, max(len(raw), 1)))] + (b"\x01" if r.random() < 0.3 else b"")
        return f"initializer {t.name}: {len(t.raw_data)} of {len(raw)} bytes"
    if how == 4:                     # said to be in an external file, outside the model's folder
        t.ClearField("raw_data")
        t.ClearField("float_data")
        t.ClearField("int64_data")
        t.data_location = TensorProto.EXTERNAL
        for k, v in (("location", str(r.choice(["../../../etc/passwd", "/etc/passwd", "w.bin", ""]))),
                     ("offset", str(int(r.choice([0, 7, -1])))), ("length", "64")):
            e = t.external_data.add()
            e.key, e.value = k, v
        return f"initializer {t.name}: external data"
    arr = numpy_helper.to_array(t).copy()
    if arr.size == 0:
        return None
    if how == 5:                     # wild values
        flat = arr.reshape(-1)
        j = int(r.integers(flat.size))
        if np.issubdtype(arr.dtype, np.floating):
            flat[j] = r.choice(WILD_FLOATS)
        elif np.issubdtype(arr.dtype, np.integer):
            info = np.iinfo(arr.dtype)
            flat[j] = int(np.clip(int(r.choice(WILD_INTS)), info.min, info.max))
        else:
            return None
    else:                            # one element dropped, or the array reshaped
        arr = arr.reshape(-1)[:-1] if r.random() < 0.5 else arr.reshape(-1)
    inits[list(inits).index(t)].CopyFrom(numpy_helper.from_array(arr, t.name))
    return f"initializer {t.name}: values"


# ops the importer claimed after seeds the tests keep were drawn, with the first seed batch (seed // 1e6) that draws
# them: a seed of an earlier batch changes an op into one of the ops claimed then, so it still builds the mutant it
# was kept for
OPS_SINCE = {"IsInf": 110, "IsNaN": 110, "Shrink": 110, "ThresholdedRelu": 110, "Upsample": 110, "TopK": 150,
             "MaxUnpool": 160, "SplitToSequence": 160, "SequenceAt": 160, "SequenceConstruct": 160,
             "ConcatFromSequence": 160}


def ops_for(seed: int) -> list[str]:
    """The op types a node may become in seed's mutant (`_mutate_node`)."""
    from tilefuse.frontend.onnx_import import claimed_ops
    return [o for o in claimed_ops() if OPS_SINCE.get(o, 0) <= seed // 10 ** 6]


def _mutate_node(r, model, ops) -> str | None:
    g = model.graph
    if not len(g.node):
        return None
    j = int(r.integers(len(g.node)))
    nd = g.node[j]
    how = int(r.integers(8))
    if how == 0 and len(nd.input):
        nd.input[int(r.integers(len(nd.input)))] = str(r.choice(["nowhere", nd.output[0], ""]))
        return f"{nd.op_type}: an input renamed"
    if how == 1 and len(nd.input):
        del nd.input[int(r.integers(len(nd.input)))]
        return f"{nd.op_type}: an input dropped"
    if how == 2:
        nd.input.append(str(r.choice(["x", nd.input[0] if len(nd.input) else "x", "", "nowhere"])))
        return f"{nd.op_type}: an input added"
    if how == 3:
        old = nd.op_type
        nd.op_type = str(r.choice(ops))
        return f"{old} -> {nd.op_type}"
    if how == 4:
        nd.domain = str(r.choice(["com.microsoft", "ai.onnx.ml", "x.y", "ai.onnx.preview.training"]))
        return f"{nd.op_type}: domain {nd.domain}"
    if how == 5:
        dup = g.node.add()
        dup.CopyFrom(nd)
        return f"{nd.op_type}: duplicated"
    if how == 6 and len(g.node) > 1:
        del g.node[j]
        return f"{nd.op_type}: removed"
    if how == 7:
        nd.output.append(str(r.choice(["extra", nd.output[0], "x"])))
        return f"{nd.op_type}: an output added"
    return None


def _mutate_graph(r, model) -> str | None:
    from onnx import TensorProto
    how = int(r.integers(6))
    if how == 0:
        model.opset_import[0].version = int(r.choice([1, 5, 7, 9, 10, 12, 14, 16, 20, 22, 23, 99, 2 ** 40]))
        return f"opset {model.opset_import[0].version}"
    if how == 1:
        model.ir_version = int(r.choice([0, 1, 3, 4, 7, 10, 11, 99]))
        return f"ir_version {model.ir_version}"
    vi = model.graph.input[0] if how < 5 else model.graph.output[0]
    tt = vi.type.tensor_type
    if how == 2 and len(tt.shape.dim):
        d = tt.shape.dim[int(r.integers(len(tt.shape.dim)))]
        v = r.choice([0, 1, 2, 2 ** 20, 2 ** 31, 2 ** 62, -1, "sym"])
        if v == "sym":
            d.dim_param = "n"
        else:
            d.dim_value = int(v)
        return f"{vi.name}: dims {[x.dim_value or x.dim_param for x in tt.shape.dim]}"
    if how == 3:
        dims = [x.dim_value for x in tt.shape.dim]
        tt.shape.ClearField("dim")
        for v in (dims[1:] if dims and r.random() < 0.5 else dims + [int(r.choice([1, 3]))]):
            tt.shape.dim.add().dim_value = v
        return f"{vi.name}: rank {len(tt.shape.dim)}"
    tt.elem_type = int(r.choice([TensorProto.DOUBLE, TensorProto.FLOAT16, TensorProto.INT64, TensorProto.BOOL,
                                 TensorProto.STRING, TensorProto.UINT8, 0, 99]))
    return f"{vi.name}: elem_type {tt.elem_type}"


MUTATIONS = [_mutate_attr, _mutate_attr, _add_attr, _mutate_init, _mutate_init, _mutate_node, _mutate_node,
             _mutate_graph]


def mutant(seed: int):
    """(bytes, the input it was built for, [what was changed]) of seed, or None."""
    r = np.random.default_rng([seed, 17])
    base = int(r.integers(2 ** 31))
    built = (onnx_graphs.build_spatial if r.random() < 0.5 else onnx_graphs.build_tensor)(base)
    if built is None:
        return None
    model, x = built
    done = []
    for _ in range(int(r.integers(1, 4))):
        for _ in range(8):
            try:
                fn = MUTATIONS[int(r.integers(len(MUTATIONS)))]
                what = fn(r, model, ops_for(seed)) if fn is _mutate_node else fn(r, model)
            except Exception:        # a part an earlier mutation broke (numpy_helper cannot read it): another
                what = None
            if what:
                done.append(what)
                break
    blob = model.SerializeToString()
    if r.random() < 0.1:             # the bytes themselves
        b = bytearray(blob)
        if r.random() < 0.5:
            for _ in range(int(r.integers(1, 4))):
                b[int(r.integers(len(b)))] ^= 1 << int(r.integers(8))
            done.append("bytes flipped")
        else:
            b = b[:int(r.integers(len(b)))]
            done.append(f"cut to {len(b)} of {len(blob)} bytes")
        blob = bytes(b)
    return blob, x, done


def _input_for(net, x):
    shape = tuple(net.inputs[0].shape)
    if tuple(x.shape) == shape:
        return x
    if int(np.prod(shape, dtype=np.float64)) > (CAPACITY // 4):
        return np.zeros(1, np.float32)          # too big to make: the run must refuse the wrong shape
    return np.random.default_rng(0).standard_normal(shape).astype(net.inputs[0].dtype)


ACCEPTED: list[str] = []


def _where(e: Exception) -> str:
    import traceback
    tb = traceback.extract_tb(e.__traceback__)[-1]
    return f"{type(e).__name__}: {str(e)[:200]} at {os.path.basename(tb.filename)}:{tb.lineno}"


def check(seed: int) -> str | None:
    """None (refused by name, or computed as ONNX Runtime computes it), or what went wrong."""
    import tilefuse
    from tilefuse.errors import TilefuseError
    from tilefuse.runtime import CPUDevice
    made = mutant(seed)
    if made is None:
        return None
    blob, x, done = made
    try:
        net = tilefuse.from_onnx(blob)
        if len(net.inputs) != 1:
            return None
        x = _input_for(net, x)
        got = np.asarray(tilefuse.Session(tilefuse.compile(net, threads=2), CPUDevice(capacity_bytes=CAPACITY),
                                          threads=2).run(x))
    except TilefuseError:
        return None
    except Exception as e:
        return f"{_where(e)} ({done})"
    want = _ort_run(blob, x)
    if isinstance(want, str):
        return _against_reference(seed, blob, x, got, done, want)
    model = _parse(blob)
    err = onnx_graphs._rel(got, np.asarray(want))
    if not err <= onnx_graphs.RTOL:
        try:
            with np.errstate(all="ignore"):
                err = min(err, onnx_graphs._rel(got, onnx_graphs._evaluator(model).run(None, {"x": x})[0]))
        except Exception:
            pass
    if not err <= onnx_graphs.RTOL and onnx_graphs._rounding_decides(model, x, got, want, seed):
        return None
    if not err <= onnx_graphs.RTOL and _overflow_decides(model, x, got, want):
        return None
    return None if err <= onnx_graphs.RTOL else f"error {err:.3g} against ONNX Runtime ({done})"


def _against_reference(seed, blob, x, got, done, refused) -> str | None:
    """A mutant tilefuse computes and ONNX Runtime refuses: against ONNX's reference evaluator where that runs it
    (a wrong value is a failure); where it refuses too, listed in ACCEPTED (tilefuse more lenient than both)."""
    try:
        from onnx import helper
        model = _parse(blob)
        dt = np.dtype(helper.tensor_dtype_to_np_dtype(model.graph.input[0].type.tensor_type.elem_type))
        with np.errstate(all="ignore"):
            ref = np.asarray(onnx_graphs._evaluator(model).run(None, {model.graph.input[0].name: x.astype(dt)})[0])
    except Exception as e:
        ACCEPTED.append(f"seed {seed}: {done}: ORT: {refused[:120]}; reference: {type(e).__name__}")
        return None
    if dt == np.float16:             # the reference rounds each node's output to float16, tilefuse computes in float32
        err = onnx_graphs._rel(got.astype(np.float32), ref.astype(np.float32))
        return None if err <= FP16_RTOL else f"error {err:.3g} against ONNX's float16 reference ({done})"
    err = onnx_graphs._rel(got, ref) if ref.dtype.kind == "f" else float("inf")
    if err <= onnx_graphs.RTOL or onnx_graphs._rounding_decides(model, x, got, ref, seed) \
            or _overflow_decides(model, x, got, ref):
        return None
    return f"error {err:.3g} against ONNX's reference where ONNX Runtime refused ({refused[:80]}) ({done})"


def _ort_output(blob, x):
    import onnxruntime as ort
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    so.log_severity_level = 4
    try:
        sess = ort.InferenceSession(blob, so, providers=["CPUExecutionProvider"])
        return np.asarray(sess.run(None, {sess.get_inputs()[0].name: x})[0])
    except Exception as e:
        return (str(e).splitlines() or [type(e).__name__])[0]


_POOL = []


def _ort_run(blob, x):
    """ONNX Runtime's output for the mutant, or why it gave none, from a worker process: ORT 1.32 itself
    crashes (SIGSEGV) on some mutants (a Mean given an input twice and one renamed, seed 1004088)."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor
    from concurrent.futures.process import BrokenProcessPool
    if not _POOL:
        _POOL.append(ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")))
    try:
        return _POOL[0].submit(_ort_output, blob, x).result()
    except BrokenProcessPool:
        _POOL.pop().shutdown(wait=False)
        return "ONNX Runtime crashed"


FP16_RTOL = 1e-2                # float16 graphs against ONNX's reference: 2^-11 rounding per node, a few nodes
OVERFLOW = float(np.sqrt(np.finfo(np.float32).max))     # 1.8e19: a square of it overflows float32
# 2.1e37: a sum of 16 such terms overflows float32 in some orders and not in others (a 3x3 conv's 72 terms, a
# Winograd transform's 4): an ELU with alpha 3e38 before a conv, whose HardSigmoid gives 1 for one order's +inf
# and 0 for another's -6e37 (seed 12076057)
NEAR_MAX = float(np.finfo(np.float32).max) / 16


def _overflow_decides(model, x, got, want) -> bool:
    """Whether the mutant is one float32 overflow decides: a value of the graph evaluated in float64 (any node's
    output) beyond 1.8e19, whose square or product with another overflows float32, and where tilefuse and ONNX
    Runtime then differ only in which elements overflowed (an inf where ORT has NaN or a finite value: a
    BatchNormalization scale of 3e38 before an AveragePool, a LayerNormalization after a MatMul by 1e30 whose
    variance overflows); the elements finite in both still agree within RTOL. A value within 16x of float32's
    largest (NEAR_MAX) decides it alone: which partial sums overflow then depends on the order of the sums."""
    if got.shape != want.shape:
        return False
    try:
        with np.errstate(all="ignore"):
            ev = onnx_graphs._evaluator(onnx_graphs._float64_model(model))
            values = ev.run(None, {"x": x.astype(np.float64)}, intermediate=True)
    except Exception:
        return False
    peak = max([float(np.abs(v[np.isfinite(v)]).max(initial=0.0)) for v in values.values()
                if isinstance(v, np.ndarray) and v.dtype.kind == "f"] + [0.0])     # (an inf constant is no overflow)
    if peak < OVERFLOW:
        return False
    if peak >= NEAR_MAX:             # sums of such values overflow or not by their order: no verdict on any element
        return True
    both = np.isfinite(got) & np.isfinite(want)
    e = onnx_graphs._element_errors(np.where(both, got, 0), np.where(both, want, 0))
    return bool((e <= onnx_graphs.RTOL).all())


def _parse(blob):
    import onnx
    return onnx.load_from_string(blob)


def main(argv=None) -> int:
    import faulthandler
    import resource
    faulthandler.enable()            # a crash names the seed's stack
    # a mutant that takes all memory fails as a MemoryError naming its seed rather than the kernel's OOM kill
    resource.setrlimit(resource.RLIMIT_AS, (AS_LIMIT, AS_LIMIT))
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--seed", type=int, default=0, help="first seed: seeds run from seed * 1e6 up")
    ap.add_argument("--seed-limit", type=float, default=600.0)
    ap.add_argument("--show-accepted", type=int, default=20,
                    help="how many mutants to print that tilefuse computes and both ORT and ONNX's reference refuse")
    a = ap.parse_args(argv)
    from random_nets import run_seeds

    def one(seed):
        print(f"\rseed {seed}", end="", file=sys.stderr, flush=True)
        try:
            return check(seed)
        except Exception as e:       # the checker's own part (ORT, the float64 probes): say where
            return f"{_where(e)} (in the checker)"

    fails = run_seeds(one, a.seconds, a.seed * 10 ** 6, "onnx mutants", a.seed_limit)
    print(f"computed where ONNX Runtime and ONNX's reference refused: {len(ACCEPTED)}")
    for line in ACCEPTED[:a.show_accepted]:
        print("  " + line)
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
