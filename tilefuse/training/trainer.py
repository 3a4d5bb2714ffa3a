"""Trainer: one network, one optimizer, one schedule ("fused" or "unfused").

    trainer = Trainer(net, SGD(lr=0.1, momentum=0.9), schedule="fused")
    loss = trainer.step(x, labels)                  # forward, backward, update
    loss, grads = trainer.forward_backward(x, labels)
    trainer.state_dict()                            # numpy, keyed by constant names
    trainer.to_torch_state_dict()                   # torch tensors (zoo/from_torch: loads as is)
    print(trainer.traffic_report())

Trainable parameters are the constants that are weights: conv2d / conv_transpose2d / linear weight and bias,
batch_norm, group_norm, layer_norm and channel_norm gamma/beta, scale alpha/beta, prelu slope (a group_norm's
imported unit weight and zero bias, GroupNorm(affine=False) and InstanceNorm2d's, stay fixed as in PyTorch), and the
constant operands of binary ops that the network records as parameters (`Network.constant_origin`, which from_torch
fills: ConvNeXt's layer scale; literals and buffers such as x + 3 stay fixed; schedule.operand_constants refuses
the rest by name). batch_norm mean/var are buffers (running statistics,
updated with each BN's momentum (`Network.bn_momentum`, else 0.1; the `bn_momentum` argument overrides it),
PyTorch's unbiased variance). The network's constants are never
modified: the trainer keeps its own writable copies.

The loss is PyTorch's F.cross_entropy over logits (N, classes) with labels (N,), or over a dense prediction
(N, classes, H, W) with labels (N, H, W) (segmentation); labels equal to `ignore_index` (default -100, as PyTorch's)
count for nothing.

Every step checks what it computes: the inputs are finite, the labels are class indices in
[0, classes) or the ignore_index, the loss and the logits are finite (else the first non-finite activation in
execution order is named), every gradient is finite before the optimizer applies it, and every
parameter after it. A failure raises NonFiniteError (or GraphError for labels) naming the step
and the tensor, instead of training on with NaN weights.
"""
from __future__ import annotations

import contextlib

import numpy as np

from ..errors import GraphError, NonFiniteError, UnsupportedOpError
from ..interpreter import bind_inputs
from ..ir import Network, ops
from ..kernels import dense
from ..kernels.elementwise import all_finite, finite_many
from .schedule import _INPUT0_GRAD, _OPERAND_SLOTS, TrainingSchedule, operand_constants
from .traffic import format_report, pattern_table

_TRAINABLE = {"conv2d": (1, 2), "conv_transpose2d": (1, 2), "linear": (1, 2), "batch_norm": (1, 2), "scale": (1, 2),
              "group_norm": (1, 2), "prelu": (1,), "layer_norm": (1, 2), "channel_norm": (1, 2)}
# constants the importers make for a norm without affine parameters (GroupNorm(affine=False), InstanceNorm2d):
# fixed, as in PyTorch (buffers, never trained)
_FIXED_SUFFIXES = (".unit_weight", ".zero_bias")
# weights the compiler's passes computed from others (passes._absorb_affine, fold_bn): not trainable as such
_FOLDED_SUFFIXES = (".weight_folded", ".bias_folded")


def _check_parameter_reads(net: Network) -> None:
    """Every read of a parameter (`constant_origin` 'parameter') is one whose backward gives it a gradient: a
    weight slot, an operand slot, input 0 of an op whose backward differentiates it. A read anywhere else would
    train the parameter with part of its gradient missing: refused naming the op."""
    for op in net.ops:
        slots = _OPERAND_SLOTS.get(op.op, ())
        for i, d in enumerate(op.inputs):
            if not d.is_constant or net.constant_origin.get(d.name) != "parameter":
                continue
            if i in _TRAINABLE.get(op.op, ()) or (slots is None or i in slots) or (i == 0 and op.op in _INPUT0_GRAD):
                continue
            raise UnsupportedOpError(
                f"{op.name}: parameter '{d.name}' {d.shape} is input {i} of a {op.op}, whose backward in the trainer "
                f"gives that input no gradient; expected a parameter only as a weight, an operand of an "
                f"element-wise op, a matmul, a concat, or input 0 of {', '.join(sorted(_INPUT0_GRAD))}")


class Trainer:
    def __init__(self, net: Network, optimizer=None, schedule: str = "fused",
                 loss: str = "cross_entropy", bn_momentum: float | None = None, seed: int = 0,
                 threads: int | None = None, ignore_index: int | None = -100):
        if loss != "cross_entropy":
            raise ValueError(f"loss '{loss}' is not supported; expected 'cross_entropy'")
        if ignore_index is not None and not isinstance(ignore_index, (int, np.integer)):
            raise ValueError(f"ignore_index={ignore_index!r}; expected an integer label (PyTorch's default "
                             f"-100, 255 for VOC-style masks) or None")
        self.ignore_index = None if ignore_index is None else int(ignore_index)
        net.lint()
        for path, what in net.train_mode_updates.items():
            # (the step would train the eval graph's function: silently another gradient than PyTorch's)
            raise UnsupportedOpError(
                f"{path}: {what}, which the network (exported in eval mode) does not hold; tilefuse trains only "
                f"networks whose training forward is the eval graph with batch statistics and dropout; expected "
                f"the module without it (torch.nn.utils.parametrize.remove_parametrizations, or train it in PyTorch)")
        self.net = net
        self.optimizer = optimizer
        self.params: dict[str, np.ndarray] = {}
        self.buffers: dict[str, np.ndarray] = {}
        self._bn_prefixes: list[str] = []
        for op in net.ops:
            for i in _TRAINABLE.get(op.op, ()):
                if i < len(op.inputs) and op.inputs[i].is_constant:
                    d = op.inputs[i]
                    if d.name.endswith(_FIXED_SUFFIXES) or net.constant_origin.get(d.name) == "buffer":
                        # a norm's unit weight / zero bias without affine parameters, a registered buffer in a
                        # weight slot: fixed, as in PyTorch
                        self.buffers.setdefault(d.name, np.array(d.value, copy=True))
                        continue
                    origin = net.constant_origin.get(d.name) or ""
                    if origin.startswith("derived from"):
                        # (training it as a free tensor would train another network: refused, not guessed)
                        raise UnsupportedOpError(
                            f"{op.name}: constant '{d.name}' in the {op.op}'s weight slot is {origin} (an "
                            f"expression of it, such as a weight standardization or an equalized-learning-rate "
                            f"scale, folded at import); its gradient would have to flow back through that "
                            f"expression; expected the network imported with from_torch(..., "
                            f"fold_parameters=False), which keeps the expression as ops the trainer differentiates")
                    if d.name.endswith(_FOLDED_SUFFIXES):
                        raise UnsupportedOpError(
                            f"{op.name}: constant '{d.name}' was folded by the compiler from other constants (a BN "
                            f"or a scale into this {op.op}); its gradient would have to flow back through the fold; "
                            f"expected the network before compile (from_torch's, the zoo's)")
                    self._add_param(d)
            if op.op == "batch_norm":
                for d in op.inputs[3:5]:
                    if d.is_constant:
                        self.buffers.setdefault(d.name, np.array(d.value, copy=True))
                mean = op.inputs[3].name
                if mean.endswith(".running_mean"):
                    self._bn_prefixes.append(mean[: -len(".running_mean")])
        for name, trainable in operand_constants(net).items():
            if trainable:
                self._add_param(net.data[name])
        _check_parameter_reads(net)
        # PyTorch's count of training batches so far: the module's (from_torch's net.module_buffers), else 0; it
        # weighs a cumulative-average BN's update (momentum=None) and goes back in the state dict
        self.num_batches_tracked = max((int(v) for k, v in net.module_buffers.items()
                                        if k.endswith(".num_batches_tracked")), default=0)
        self.threads = threads                       # None: all cores (kernels.threads.cpu_count())
        self.schedule = TrainingSchedule(net, self.params, self.buffers, schedule, bn_momentum, seed)
        self.schedule.batches_tracked = lambda: self.num_batches_tracked
        self.last_loss = None

    def _add_param(self, d) -> None:
        """The trained copy of constant d: under its own name, or (a view of a parameter, net.constant_alias)
        under the parameter's name in the parameter's shape."""
        key, shape = self.net.constant_alias.get(d.name, (d.name, d.shape))
        if d.name in self.net.constant_gather:      # some of the parameter's elements, moved (a bias table read)
            g, full = self.net.constant_gather[d.name]
            v = np.array(full, copy=True).reshape(shape)
            if not np.array_equal(v.reshape(-1)[g], np.asarray(d.value).reshape(-1), equal_nan=True):
                raise GraphError(d.name, f"is a gather of parameter '{key}' whose values disagree with it")
        else:
            v = np.array(d.value, copy=True).reshape(shape)
        have = self.params.setdefault(key, v)
        if have.shape != v.shape or not np.array_equal(have, v, equal_nan=True):
            raise GraphError(d.name, f"is parameter '{key}' {v.shape}, which the network also holds as "
                                     f"{have.shape} with other values; expected one value per parameter")

    @property
    def patterns(self):
        return self.schedule.found

    # ------------------------------------------------------------------ steps

    def forward(self, x) -> np.ndarray:
        """Training-mode forward pass; returns the logits (N, classes) or (N, classes, H, W)."""
        xs = bind_inputs(self.net, x)
        return self.schedule.forward(xs)

    def forward_backward(self, x, labels, input_grads: bool = True):
        """(loss, grads): gradients of every trainable parameter by constant name, plus (with
        input_grads) the network inputs' gradients under their input names (NCHW)."""
        with _threads(self.threads):
            return self._forward_backward(x, labels, input_grads)

    def _forward_backward(self, x, labels, input_grads=True):
        step = self.num_batches_tracked + 1
        xs = bind_inputs(self.net, x)
        for d, a in zip(self.net.inputs, xs):
            _check_finite(step, "input", d.name, a)
        labels = check_labels(labels, self.schedule.logits.shape, self.ignore_index)
        logits = self.schedule.forward(xs)
        loss, dlogits = dense.softmax_cross_entropy(logits, labels, self.ignore_index)
        if not np.isfinite(loss) or not np.all(np.isfinite(logits)):
            name, what = self._first_nonfinite_activation()
            raise NonFiniteError(f"step {step}: the loss is {loss:.4g}; first non-finite tensor: {what} "
                                 f"'{name}' (the weights were not updated; expected finite values: "
                                 f"lower the learning rate or check the inputs)")
        dins = self.schedule.backward(dlogits, input_grads)
        grads = dict(self.schedule.pgrads)
        grads.update(dins)
        _check_all(step, "gradient of", [(k, grads[k]) for k in list(self.params) + [d.name for d in self.net.inputs]
                                          if k in grads], "the weights were not updated")
        self.num_batches_tracked += 1
        _check_all(step, "running statistic", list(self.buffers.items()))
        self.last_loss = loss
        return loss, grads

    def _first_nonfinite_activation(self) -> tuple[str, str]:
        """The first tensor of the last forward pass (in execution order) holding NaN or inf."""
        for name, a in self.schedule.env.items():
            if isinstance(a, np.ndarray) and a.dtype.kind == "f" and not np.all(np.isfinite(a)):
                return name, "activation"
        for k, v in self.params.items():
            if not np.all(np.isfinite(v)):
                return k, "parameter"
        return self.net.outputs[0].name, "logits"

    def step(self, x, labels) -> float:
        if self.optimizer is None:
            raise ValueError("Trainer.step needs an optimizer; construct Trainer(net, SGD(...))")
        loss, grads = self.forward_backward(x, labels, input_grads=False)
        with _threads(self.threads):                 # (the update and the checks split over the step's threads)
            self.optimizer.step(self.params, {k: v for k, v in grads.items() if k in self.params})
            _check_all(self.num_batches_tracked, "parameter", list(self.params.items()),
                       "after the update: lower the learning rate")
        return loss

    def predict(self, x, batch: int | None = None) -> np.ndarray:
        """Inference logits with the trained weights (running statistics, reference kernels)."""
        from ..interpreter import evaluate
        net = self.inference_network()
        return evaluate(net, x)[0]

    # ------------------------------------------------------------------ weights

    def state_dict(self) -> dict[str, np.ndarray]:
        """Weights and BN running statistics by constant name (torch keys for zoo/from_torch
        networks, which also get `<bn>.num_batches_tracked` and the module's other buffers as they were)."""
        # the module's buffers that training leaves as they are (from_torch's net.module_buffers), then the state
        out = {k: np.array(v, copy=True) for k, v in self.net.module_buffers.items()}
        out.update({k: v.copy() for k, v in self.params.items()})
        # (not the importer's unit weights / zero biases of norms without affine parameters: no module state)
        out.update({k: v.copy() for k, v in self.buffers.items() if not k.endswith(_FIXED_SUFFIXES)})
        for p in self._bn_prefixes:
            out[p + ".num_batches_tracked"] = np.array(self.num_batches_tracked, dtype=np.int64)
        return out

    def to_torch_state_dict(self):
        import torch
        return {k: torch.from_numpy(np.array(v)) for k, v in self.state_dict().items()}

    def load_state_dict(self, state: dict) -> None:
        for k, v in state.items():
            v = np.asarray(v.detach().cpu().numpy() if hasattr(v, "detach") else v)
            if k in self.params:
                self.params[k][...] = v
            elif k in self.buffers:
                self.buffers[k][...] = v
            elif k.endswith(".num_batches_tracked"):
                self.num_batches_tracked = int(v)
            elif k in self.net.module_buffers:
                have = self.net.module_buffers[k]
                if v.shape != have.shape or not np.array_equal(v, have, equal_nan=True):
                    raise ValueError(f"state key '{k}' is a buffer of the module that the network holds as "
                                     f"constants folded at import ({have.shape}); a load cannot change it (found "
                                     f"{v.shape} with other values); expected its value at import, or import the "
                                     f"module again (from_torch) with the new buffer")
            else:
                raise KeyError(f"state key '{k}' is not a parameter or buffer of '{self.net.name}'")

    def inference_network(self, batch: int | None = None) -> Network:
        """A copy of the network with the trained weights bound (for the reference evaluator
        or the compiler); softmax tail kept."""
        new = self.net.clone()
        for d in new.constants():
            key = self.net.constant_alias.get(d.name, (d.name,))[0]
            v = self.params.get(key, self.buffers.get(d.name))
            if v is not None and d.name in self.net.constant_gather and key in self.params:
                v = v.reshape(-1)[self.net.constant_gather[d.name][0]].reshape(d.shape)
            if v is not None:
                v = v.reshape(d.shape)
                d.value = None
                d.bind_constant(v)
        if batch is not None and batch != new.inputs[0].shape[0]:
            raise GraphError(new.name, f"batch {batch} differs from the network's batch "
                                       f"{new.inputs[0].shape[0]}; rebuild the network")
        return new

    # ------------------------------------------------------------------ reports

    def traffic(self) -> list[dict]:
        """Per-pattern traffic and memory held of the last step (bytes and paper units)."""
        s = self.schedule
        return pattern_table(s.found, s.log, s.mem)

    def traffic_report(self, print_it: bool = True) -> str:
        s = self.schedule
        if not hasattr(s, "log"):
            raise RuntimeError("traffic_report() needs one executed step first")
        layers = [(op.name, op.op) for op in s.ops]
        mb = {op.name for op in s.ops if op.op in ops.MEMORY_BOUND}
        unit_of = {op.name: op.inputs[0].nbytes for op in s.ops}
        for p in s.found:
            for m in p.members:
                unit_of[m.name] = p.unit_bytes
        text = format_report(s.mode, layers, s.found, s.log, s.mem, mb, unit_of)
        if print_it:
            print(text)
        return text


def _check_all(step: int, what: str, items, note: str = "") -> None:
    """_check_finite for every (name, array), in order, the finiteness of all of them read in one split
    over the step's threads (`kernels.elementwise.finite_many`)."""
    for (name, a), ok in zip(items, finite_many([a for _, a in items])):
        if not ok:
            _check_finite(step, what, name, a, note)


def _check_finite(step: int, what: str, name: str, a, note: str = "") -> None:
    a = np.asarray(a)
    if a.dtype.kind in "fc" and not all_finite(a):
        bad = ~np.isfinite(a)
        first = tuple(int(i) for i in np.argwhere(bad)[0])
        raise NonFiniteError(f"step {step}: {what} '{name}' has {int(bad.sum())} non-finite value(s) "
                             f"({a[first]} at {first}); expected finite values" + (f" ({note})" if note else ""))


def check_labels(labels, logits_shape, ignore_index=None) -> np.ndarray:
    """Class indices as int64: (N,) for logits (N, classes), one per image; (N, H, W) for a dense prediction
    (N, classes, H, W), one per pixel; integers in [0, classes) or ignore_index, at least one not ignored;
    else GraphError."""
    lab = np.asarray(labels)
    n, classes = logits_shape[:2]
    want = (n,) + tuple(logits_shape[2:])
    if lab.shape != want:
        per = "image" if len(want) == 1 else "pixel of the (N, H, W) prediction"
        raise GraphError("labels", f"found shape {lab.shape}, expected {want}: one class index per {per}")
    if lab.dtype.kind == "f":
        if not np.all(np.isfinite(lab)) or np.any(lab != np.round(lab)):
            raise GraphError("labels", f"found non-integer values (dtype {lab.dtype}); expected class indices")
    elif lab.dtype.kind not in "iu":
        raise GraphError("labels", f"found dtype {lab.dtype}; expected integer class indices")
    flat = lab.reshape(-1)
    ignored = flat == ignore_index if ignore_index is not None else np.zeros(flat.shape, bool)
    bad = np.flatnonzero(((flat < 0) | (flat >= classes)) & ~ignored)
    if bad.size:
        at = tuple(int(i) for i in np.unravel_index(bad[0], lab.shape))
        raise GraphError("labels", f"found {flat[bad[0]]} at position {at if len(at) > 1 else at[0]} ({bad.size} "
                                   f"out of range); expected class indices in [0, {classes})"
                                   + (f" or the ignore_index {ignore_index}" if ignore_index is not None else ""))
    if ignored.all():
        raise GraphError("labels", f"every one of the {flat.size} labels is the ignore_index {ignore_index}; "
                                   f"expected at least one class index (the mean loss would be 0 / 0)")
    return lab.astype(np.int64)


@contextlib.contextmanager
def _threads(threads=None):
    """One thread pool per step: the step's thread split (kernels/threads.py `using`, `threads`
    threads, default all cores) runs every kernel; BLAS runs single-threaded inside it and numba's own
    pool is set to one thread.

    With two pools (OpenBLAS workers spin after each GEMM, numba's OpenMP threads wait at
    every parallel region) on this machine's 2 shared cores a short numba loop waited ~6-10 ms
    for a descheduled thread, and a ResNet50 batch-8 64x64 step took 2.0 s instead of
    0.36-0.41 s on one thread; with one pool whose idle workers block, both cores work on
    independent tiles (image ranges, column ranges, channel ranges).
    """
    import numba

    from ..kernels.blas import blas_threads
    from ..kernels.threads import using
    _keep_freed_memory()
    old = numba.get_num_threads()
    numba.set_num_threads(1)
    try:
        with blas_threads(1), using(threads):
            yield
    finally:
        numba.set_num_threads(old)


_HEAP = {"done": False}


def _keep_freed_memory() -> None:
    """Once per process, on glibc: keep freed memory in the heap (no mmap for large blocks, no
    trimming), so that a step's activations and gradients reuse the pages the last step freed.
    Otherwise every large array is a fresh mmap whose pages fault in on first touch: ~8000
    page faults and 0.1-0.3 s of system time per ResNet18 batch-32 112x112 step (1.7 s of
    CPU). The process keeps its peak heap instead of returning it to the system."""
    if _HEAP["done"]:
        return
    _HEAP["done"] = True
    import ctypes
    import ctypes.util
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):                # not glibc: nothing to tune
        return
    M_TRIM_THRESHOLD, M_MMAP_MAX = -1, -4
    mallopt(M_MMAP_MAX, 0)
    mallopt(M_TRIM_THRESHOLD, 1 << 30)
