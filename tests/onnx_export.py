"""Helpers for the ONNX tests: export a torch module with either torch exporter, run ONNX Runtime,
compare (tests only)."""
from __future__ import annotations

import contextlib
import io
import logging
import warnings

import numpy as np
import torch

EXPORTERS = ("torchscript", "dynamo")


def export(module, x: np.ndarray, exporter: str, opset: int | None = None, dynamic: bool = False) -> bytes:
    """ONNX bytes of `module` traced at `x` by torch.onnx.export(dynamo=False) ("torchscript"),
    torch.onnx.export(dynamo=True) ("dynamo"), or the latter without its graph optimizer
    ("dynamo_unoptimized": Shape/Expand/CastLike chains left for the importer to fold); the input is
    named "x"."""
    kw = {} if opset is None else {"opset_version": opset}
    if exporter == "dynamo_unoptimized":
        kw["optimize"] = False
    if dynamic:
        kw["dynamic_axes" if exporter == "torchscript" else "dynamic_shapes"] = (
            {"x": {0: "n"}} if exporter == "torchscript" else ({0: torch.export.Dim("n", min=1, max=64)},))
    f = io.BytesIO()
    logging.getLogger("torch.onnx").setLevel(logging.ERROR)
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()), torch.no_grad():
        warnings.simplefilter("ignore")
        torch.onnx.export(module.eval(), (torch.from_numpy(x.copy()),), f, dynamo=exporter != "torchscript",
                          input_names=["x"], **kw)
    return f.getvalue()


def ort_run(blob: bytes, x: np.ndarray, all_outputs: bool = False):
    """ONNX Runtime's first output (or every output) for input "x"."""
    import onnxruntime as ort
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    ys = ort.InferenceSession(blob, so, providers=["CPUExecutionProvider"]).run(None, {"x": x})
    return ys if all_outputs else ys[0]


def torch_run(module, x: np.ndarray, all_outputs: bool = False):
    """PyTorch's output (or every output, as a list) for x, in eval mode."""
    with torch.no_grad():
        y = module.eval()(torch.from_numpy(x.copy()))
    if all_outputs:
        return [t.numpy() for t in (y if isinstance(y, (list, tuple)) else [y])]
    return y.numpy()


def assert_close_to_max(y: np.ndarray, ref: np.ndarray, rel: float = 1e-4, what: str = ""):
    """|y - ref| <= rel * max|ref| everywhere (the issue's fp32 criterion), with equal shapes."""
    assert y.shape == ref.shape, f"{what}: shape {y.shape}, expected {ref.shape}"
    scale = float(np.abs(ref).max()) or 1.0
    err = float(np.abs(y.astype(np.float64) - ref).max())
    assert err <= rel * scale, f"{what}: max error {err:.3g} > {rel} * max|ref| = {rel * scale:.3g}"


def check_from_torch(make, x: np.ndarray, seed: int = 0, threads=(1, 3), fold_parameters: bool = True):
    """tilefuse.from_torch(make()) -> compile (each thread count) against PyTorch (the issue's fp32 criterion)."""
    import tilefuse
    torch.manual_seed(seed)
    m = make().eval()
    net = tilefuse.from_torch(m, torch.from_numpy(x), fold_parameters=fold_parameters)
    want = torch_run(m, x)
    for t in threads:
        assert_close_to_max(tilefuse.compile(net, threads=t).run(x), want, what=f"{t} threads")


def check_export(make, x: np.ndarray, exporter: str, seed: int = 1):
    """make() exported by `exporter` -> from_onnx -> compile, against PyTorch and ONNX Runtime."""
    import tilefuse
    torch.manual_seed(seed)
    m = make().eval()
    blob = export(m, x, exporter)
    y = tilefuse.compile(tilefuse.from_onnx(blob)).run(x)
    assert_close_to_max(y, torch_run(m, x), what="against PyTorch")
    assert_close_to_max(y, ort_run(blob, x), what="against ONNX Runtime")
