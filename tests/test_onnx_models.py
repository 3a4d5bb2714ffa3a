"""The modern CNNs of the zoo and the test suite through ONNX (issue 9): each torch twin
(tests/modern_models.py, carrying the zoo net's constants; GhostNet and the YOLO-style neck with
seeded weights) exported by both torch exporters (`dynamo=False` and `dynamo=True`), imported with
from_onnx, compiled, saved, loaded and run through a Session: equal to ONNX Runtime on the same file
and to PyTorch, every output.

Tolerance: fp32, max |tilefuse - reference| <= 1e-4 * max |reference| (the issue's criterion).
Sizes: 64x64 inputs, batch 1, to keep the file to the export time (the dynamo exporter takes a few
seconds per model).
"""
from __future__ import annotations

import numpy as np
import pytest

import tilefuse
import tilefuse.models as models
from onnx_export import EXPORTERS, assert_close_to_max, export, ort_run, torch_run

import modern_models as mm

SIZE = 64


def _twin(name):
    if name in mm.ZOO:
        net = models.get(name, seed=3, batch=1, image_size=SIZE)
        return mm.load(name, net), net.inputs[0].shape
    return mm.randomize(mm.build(name, 10), seed=2), (1, 3, SIZE, SIZE)


@pytest.mark.parametrize("exporter", EXPORTERS)
@pytest.mark.parametrize("name", list(mm.BUILDERS))
def test_model_through_onnx(name, exporter, tmp_path):
    twin, shape = _twin(name)
    x = np.random.default_rng(5).standard_normal(shape).astype(np.float32)
    blob = export(twin, x, exporter)
    net = tilefuse.from_onnx(blob)
    path = tilefuse.compile(net).save(tmp_path / "m.tfpkg")
    got = tilefuse.Session(tilefuse.load_package(path)).run(x)
    got = got if isinstance(got, list) else [got]
    want_ort, want_torch = ort_run(blob, x, all_outputs=True), torch_run(twin, x, all_outputs=True)
    assert len(got) == len(want_ort) == len(want_torch)
    for i, (g, o, t) in enumerate(zip(got, want_ort, want_torch)):
        assert np.abs(t).max() > 0.01 and np.isfinite(t).all()
        assert_close_to_max(g, o, what=f"{name}/{exporter} output {i} vs ONNX Runtime")
        assert_close_to_max(g, t, what=f"{name}/{exporter} output {i} vs PyTorch")
