"""Tables read at run-time indices (the IR's take): a class-conditional model's nn.Embedding of its label input, a
diffusion schedule's `alphas_cumprod[t]` and `a.gather(-1, t)` (guided-diffusion's `_extract_into_tensor`, DDPM
code's `extract`). The indices are integer inputs (ir/node.py check_inputs); an index out of range fails the run
naming it, as PyTorch and ONNX Runtime fail. from_torch against PyTorch, both exporters against ONNX Runtime (Gather,
GatherElements, GatherND), the kernel against the reference."""
from __future__ import annotations

import io
import logging
import warnings

import numpy as np
import pytest
import torch
import torch.nn as nn
from onnx_export import assert_close_to_max

import tilefuse
from tilefuse.kernels import reference as ref
from tilefuse.kernels.movement import take as take_kernel


class Conditional(nn.Module):
    def __init__(self, classes=10, steps=1000):
        super().__init__()
        self.label_emb = nn.Embedding(classes, 8)
        self.register_buffer("alphas_cumprod", torch.cumprod(1 - torch.linspace(1e-4, 0.02, steps), 0))
        self.conv = nn.Conv2d(3, 8, 3, padding=1)

    def forward(self, x, t, y):
        a = self.alphas_cumprod[t].view(-1, 1, 1, 1)                      # aten.index at t
        b = self.alphas_cumprod.gather(-1, t).reshape(-1, 1, 1, 1)        # aten.gather at t
        h = self.conv(a.sqrt() * x + (1 - b).sqrt())
        return h + self.label_emb(y)[:, :, None, None]


def _inputs(n=3, seed=0):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((n, 3, 8, 8)).astype(np.float32), np.array([0, 999, 417, 5][:n], np.int64),
            np.array([3, 0, 9, 4][:n], np.int64))


def _torch(m, x, t, y):
    with torch.no_grad():
        return m(torch.from_numpy(x), torch.from_numpy(t), torch.from_numpy(y)).numpy()


def test_from_torch_matches_pytorch_and_refuses_indices_out_of_range():
    torch.manual_seed(0)
    m = Conditional().eval()
    x, t, y = _inputs()
    net = tilefuse.from_torch(m, tuple(torch.from_numpy(a) for a in (x, t, y)))
    assert net.integer_inputs == {"t": "<i8", "y": "<i8"}
    assert sum(o.op == "take" for o in net.ops) == 3
    sess = tilefuse.compile(net)
    assert_close_to_max(sess.run([x, t, y]), _torch(m, x, t, y), what="from_torch")
    x2, t2, y2 = _inputs(3, seed=1)
    t2[:] = [999, 0, 1]
    assert_close_to_max(sess.run([x2, t2, y2.astype(np.int32)]), _torch(m, x2, t2, y2), what="second call")
    with pytest.raises(RuntimeError, match=r"instruction take -> 'label_emb' failed: index 10 \(element 1 of the "
                                           r"indices\) is out of range: expected an integer in \[0, 10\)"):
        sess.run([x, t, np.array([3, 10, 1])])
    with pytest.raises(RuntimeError, match=r"index 1000 \(element 2 of the indices\) is out of range: expected an "
                                           r"integer in \[-1000, 1000\)"):
        sess.run([x, np.array([0, 5, 1000]), y])
    with pytest.raises(tilefuse.GraphError, match=r"y: input has the value 16777218"):
        sess.run([x, t, np.array([3, 16777218, 1])])


@pytest.mark.parametrize("exporter", ["torchscript", "dynamo"])
def test_onnx_exports_match_onnx_runtime(exporter):
    import onnxruntime as ort
    torch.manual_seed(1)
    m = Conditional().eval()
    x, t, y = _inputs(seed=2)
    f = io.BytesIO()
    logging.getLogger("torch.onnx").setLevel(logging.ERROR)
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        torch.onnx.export(m, tuple(torch.from_numpy(a) for a in (x, t, y)), f, dynamo=exporter == "dynamo",
                          input_names=["x", "t", "y"])
    net = tilefuse.from_onnx(f.getvalue())
    assert "take" in {o.op for o in net.ops}
    got = tilefuse.compile(net).run([x, t, y])
    want = ort.InferenceSession(f.getvalue(), providers=["CPUExecutionProvider"]).run(None, {"x": x, "t": t, "y": y})
    assert_close_to_max(got, want[0], what="against ONNX Runtime")
    assert_close_to_max(got, _torch(m, x, t, y), what="against PyTorch")


@pytest.mark.parametrize("axis", [0, 1, 2, -1])
def test_kernel_is_the_reference(axis):
    rng = np.random.default_rng(3)
    x = rng.standard_normal((4, 5, 6)).astype(np.float32)
    n = x.shape[axis]
    for shape in [(3,), (2, 3), (1,)]:
        idx = rng.integers(-n, n, shape).astype(np.float32)
        want = ref.take(x, idx, axis)
        assert want.shape == x.shape[:axis % 3] + shape + x.shape[axis % 3 + 1:]
        np.testing.assert_array_equal(want, np.take(x, idx.astype(np.int64), axis))
        out = np.full_like(want, 7.0)
        take_kernel(out, x, idx, axis=axis)
        np.testing.assert_array_equal(out, want)
    for bad, msg in [(np.float32([1, 2.5]), r"index 2.5 \(element 1"), (np.float32([np.nan]), r"index nan"),
                     (np.float32([0, -n - 1]), rf"index {-n - 1} \(element 1")]:
        out = np.full(x.shape[:axis % 3] + bad.shape + x.shape[axis % 3 + 1:], 7.0, np.float32)
        with pytest.raises(ValueError, match=msg):
            take_kernel(out, x, bad, axis=axis)
        assert (out == 7.0).all()      # checked before anything is written
    with pytest.raises(ValueError, match=r"index -1 \(element 0 of the indices\) is out of range: expected an "
                                         r"integer in \[0, "):
        ref.take(x, np.float32([-1]), axis, negative=False)


def test_what_is_refused_is_refused_by_name():
    class Scatter(nn.Module):
        def forward(self, x, t):
            return x + torch.zeros(4, 10).scatter(1, t[:, None].expand(4, 1), 1.0).sum(1)[:, None, None, None]

    x, t = torch.randn(4, 3, 5, 5), torch.tensor([1, 2, 3, 4])
    with pytest.raises(tilefuse.UnsupportedOpError,
                       match=r"scatter with 'expand' \(an integer input's values\) as indices"):
        tilefuse.from_torch(Scatter(), (x, t))


@pytest.mark.parametrize("pad,freq", [(None, False), (3, False), (None, True), (0, True)])
def test_take_backward_matches_autograd(pad, freq):
    """The table's gradient: nn.Embedding's (padding_idx: none for that row; scale_grad_by_freq: a row's sum over
    how often it was read), and index_select along axis 1 with negative indices (repeats add)."""
    from tilefuse.kernels.train_elementwise import take_backward
    rng = np.random.default_rng(4)
    w = torch.tensor(rng.standard_normal((7, 5)), requires_grad=True)
    idx = torch.tensor([[3, 1, 3], [0, 6, 3]])
    dy = rng.standard_normal((2, 3, 5))
    torch.nn.functional.embedding(idx, w, padding_idx=pad, scale_grad_by_freq=freq).backward(torch.tensor(dy))
    got = take_backward(dy, (7, 5), idx.numpy().astype(np.float64), 0, False, pad, freq)
    np.testing.assert_allclose(got, w.grad.numpy(), rtol=0, atol=1e-12)
    x = torch.tensor(rng.standard_normal((2, 4, 3)), requires_grad=True)
    i = torch.tensor([-1, 2, 3, 2, 0])
    dy = rng.standard_normal((2, 5, 3))
    torch.index_select(x, 1, i % 4).backward(torch.tensor(dy))
    np.testing.assert_allclose(take_backward(dy, (2, 4, 3), i.numpy().astype(np.float32), 1, True), x.grad.numpy(),
                               rtol=0, atol=1e-12)


class ConditionalClassifier(nn.Module):
    """A class-conditional network as GAN discriminators and conditional UNets write it: a label embedding added to
    the features per channel, a diffusion schedule read at t (a buffer: fixed), a classifier head."""

    def __init__(self, pad=None, freq=False):
        super().__init__()
        self.base = Conditional()
        self.base.label_emb = nn.Embedding(10, 8, padding_idx=pad, scale_grad_by_freq=freq)
        self.fc = nn.Linear(8, 5)

    def forward(self, x, t, y):
        return self.fc(torch.relu(self.base(x, t, y)).mean((2, 3)))


@pytest.mark.parametrize("pad,freq", [(None, False), (9, True)])
def test_a_class_conditional_network_trains_as_torch(pad, freq):
    """One step's loss and every parameter's gradient (the embedding's included) against PyTorch in float64, the
    embedding after an SGD step, and the state dict loaded back into the module with strict=True."""
    import copy

    import torch.nn.functional as F
    from tilefuse.training import SGD, Trainer
    torch.manual_seed(3)
    m = ConditionalClassifier(pad, freq)
    x, t, y = _inputs(4, seed=2)
    y[:] = [9, 4, 9, 1]
    labels = np.array([0, 4, 2, 1])
    ex = tuple(torch.from_numpy(a) for a in (x, t, y))
    tr = Trainer(tilefuse.from_torch(m, ex), SGD(lr=0.1))
    loss, grads = tr.forward_backward([x, t, y], labels)
    m64 = copy.deepcopy(m).double()
    ref_loss = F.cross_entropy(m64(torch.from_numpy(x).double(), *ex[1:]), torch.from_numpy(labels))
    ref_loss.backward()
    assert loss == pytest.approx(ref_loss.item(), rel=1e-5)
    for k, p in m64.named_parameters():
        g = p.grad.numpy()
        np.testing.assert_allclose(grads[k], g, rtol=0, atol=1e-4 * np.abs(g).max(), err_msg=k)
    if pad is not None:
        assert not grads["base.label_emb.weight"][pad].any()
    before = tr.state_dict()["base.label_emb.weight"].copy()
    tr.step([x, t, y], labels)
    after = tr.to_torch_state_dict()
    moved = np.abs(after["base.label_emb.weight"].numpy() - before).max(axis=1)
    assert set(np.flatnonzero(moved)) == {4, 1} | ({9} if pad is None else set())
    m.load_state_dict(after, strict=True)
