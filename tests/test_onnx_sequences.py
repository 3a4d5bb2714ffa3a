"""ONNX sequences inside a graph: SplitToSequence, SequenceConstruct, SequenceAt, ConcatFromSequence.

The dynamo exporter without its optimizer writes torch.split / Tensor.chunk as SplitToSequence + SequenceAt
(ResNeSt's split attention, MaxViT's qkv chunk: tests/test_zoo_vision.py); the importer holds a sequence as its
tensors (convert.Sequence) and reads it at constant positions. Hand-built graphs cover the spec's forms (split a
scalar with a smaller last piece, sizes, none with and without keepdims; negative positions; concat and stack)
against ONNX Runtime, bit for bit (the ops move values). A sequence as a graph output or where a tensor is read is
refused by name."""
from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn as nn
from onnx import TensorProto, helper

import tilefuse
from onnx_export import EXPORTERS, assert_close_to_max, export, ort_run
from tilefuse.errors import UnsupportedOpError

X = np.random.default_rng(0).standard_normal((2, 7, 5, 6)).astype(np.float32)


def _model(nodes, inits=(), opset=18, out_shape=(None,) * 4):
    inp = helper.make_tensor_value_info("x", TensorProto.FLOAT, list(X.shape))
    out = helper.make_tensor_value_info("y", TensorProto.FLOAT, list(out_shape))
    g = helper.make_graph(nodes, "seq", [inp], [out], list(inits))
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)]).SerializeToString()


def _i64(name, v):
    v = np.asarray(v, dtype=np.int64)
    return helper.make_tensor(name, TensorProto.INT64, v.shape, v.reshape(-1).tolist())


def _check(blob):
    got = tilefuse.compile(tilefuse.from_onnx(blob)).run(X)
    want = ort_run(blob, X)
    assert got.shape == want.shape
    np.testing.assert_array_equal(got, want)


CASES = {
    # split 3 of 7 channels -> 3, 3, 1; the last (position -1) times the first
    "scalar_split": ([helper.make_node("SplitToSequence", ["x", "s"], ["q"], axis=1),
                      helper.make_node("SequenceAt", ["q", "p0"], ["a"]),
                      helper.make_node("SequenceAt", ["q", "pm1"], ["b"]),
                      helper.make_node("Mul", ["a", "b"], ["y"])],
                     [_i64("s", 3), _i64("p0", 0), _i64("pm1", -1)]),
    "sizes": ([helper.make_node("SplitToSequence", ["x", "s"], ["q"], axis=-1),
               helper.make_node("SequenceAt", ["q", "p1"], ["a"]),
               helper.make_node("SequenceAt", ["q", "p2"], ["b"]),
               helper.make_node("Sub", ["a", "b"], ["y"])],
              [_i64("s", [1, 2, 2, 1]), _i64("p1", 1), _i64("p2", 2)]),
    # no split: size-1 pieces along H squeezed (keepdims 0), stacked back along a new last axis
    "unbind_stack": ([helper.make_node("SplitToSequence", ["x"], ["q"], axis=2, keepdims=0),
                      helper.make_node("ConcatFromSequence", ["q"], ["y"], axis=-1, new_axis=1)], []),
    "keepdims_concat": ([helper.make_node("SplitToSequence", ["x"], ["q"], axis=3),
                         helper.make_node("ConcatFromSequence", ["q"], ["y"], axis=0)], []),
    "construct": ([helper.make_node("Relu", ["x"], ["r"]),
                   helper.make_node("Neg", ["x"], ["n"]),
                   helper.make_node("SequenceConstruct", ["r", "n", "x"], ["q"]),
                   helper.make_node("SequenceAt", ["q", "p1"], ["b"]),
                   helper.make_node("ConcatFromSequence", ["q"], ["c"], axis=1),
                   helper.make_node("Add", ["c", "c"], ["d"]),
                   helper.make_node("Slice", ["d", "st", "en", "ax"], ["e"]),
                   helper.make_node("Mul", ["e", "b"], ["y"])],
                  [_i64("p1", 1), _i64("st", [7]), _i64("en", [14]), _i64("ax", [1])]),
}


@pytest.mark.parametrize("case", list(CASES))
def test_sequence_graphs_match_onnxruntime(case):
    nodes, inits = CASES[case]
    _check(_model(nodes, inits))


class Splits(nn.Module):
    """torch.split by a size and by sizes, chunk, unbind + stack: the forms real model code uses."""

    def forward(self, x):
        a, b = torch.split(x, 4, dim=1)
        c, d, e = x.chunk(3, dim=3)
        f = torch.split(x, [3, 5], 1)
        g = torch.unbind(x, 2)
        return (a * b)[:, :3] + (c * d + e).sum() + f[1][:, :3] * f[0] + torch.stack(g[::-1], 2)[:, :3]


@pytest.mark.parametrize("exporter", EXPORTERS + ("dynamo_unoptimized",))
def test_splits_match_pytorch_and_onnxruntime(exporter):
    x = np.random.default_rng(1).standard_normal((2, 8, 6, 6)).astype(np.float32)
    blob = export(Splits(), x, exporter)
    got = tilefuse.compile(tilefuse.from_onnx(blob)).run(x)
    assert_close_to_max(got, Splits()(torch.from_numpy(x)).numpy(), what="against PyTorch")
    assert_close_to_max(got, ort_run(blob, x), what="against ONNX Runtime")


def test_a_sequence_is_refused_where_a_tensor_is_read_or_returned():
    split = helper.make_node("SplitToSequence", ["x", "s"], ["q"], axis=1)
    with pytest.raises(UnsupportedOpError, match=r"input 'q' is a sequence of 3 tensors; expected a tensor"):
        tilefuse.from_onnx(_model([split, helper.make_node("Relu", ["q"], ["y"])], [_i64("s", 3)]))
    seq_out = helper.make_graph([helper.make_node("SplitToSequence", ["x", "s"], ["y"], axis=1)], "seq",
                                [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(X.shape))],
                                [helper.make_tensor_sequence_value_info("y", TensorProto.FLOAT, [None] * 4)],
                                [_i64("s", 3)])
    blob = helper.make_model(seq_out, opset_imports=[helper.make_opsetid("", 18)]).SerializeToString()
    with pytest.raises(UnsupportedOpError, match=r"graph output 'y' is a sequence of 3 tensors"):
        tilefuse.from_onnx(blob)
    with pytest.raises(tilefuse.errors.GraphError, match=r"position 3 in a sequence of 3 tensors"):
        tilefuse.from_onnx(_model([split, helper.make_node("SequenceAt", ["q", "p"], ["y"])],
                                  [_i64("s", 3), _i64("p", 3)]))
