"""Demo: a small residual network with BN trained on the 8x8 digits data set.

The data (scikit-learn's `load_digits`, 1797 images of 8x8 pixels with values 0..16, from
the UCI optical recognition of handwritten digits set) ships inside the package as
`tilefuse/training/data/digits.npz`, so no download and no scikit-learn are needed.
"""
from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np

from ..ir import Network
from .optim import SGD
from .trainer import Trainer

DATA = Path(__file__).with_name("data") / "digits.npz"


def load_digits_data(seed: int = 0, test_fraction: float = 0.2):
    """(x_train, y_train, x_test, y_test): float32 (N, 1, 8, 8) scaled to about [-1, 1];
    a stratified split with a fixed seed."""
    if not DATA.exists():
        raise FileNotFoundError(f"{DATA} is missing; it ships with tilefuse (re-create it with "
                                f"scikit-learn: sklearn.datasets.load_digits)")
    with np.load(DATA) as d:
        images, labels = d["images"].astype(np.float32), d["labels"].astype(np.int64)
    x = (images / 8.0 - 1.0)[:, None]                  # (N, 8, 8) -> (N, 1, 8, 8)
    rng = np.random.default_rng(seed)
    test = np.zeros(len(labels), bool)
    for c in range(10):
        idx = rng.permutation(np.flatnonzero(labels == c))
        test[idx[: int(round(len(idx) * test_fraction))]] = True
    return x[~test], labels[~test], x[test], labels[test]


def digits_net(batch: int, seed: int = 0, width: int = 32) -> Network:
    """stem conv-BN-ReLU, an identity residual block, a stride-2 block with a projection
    shortcut, a 1x1 conv-BN-ReLU, global average pool, linear: patterns 3, 4-1, 3, 4-2."""
    rng = np.random.default_rng(seed)
    net = Network("digits_resnet")

    def conv(x, o, k, name, stride=1):
        c = x.shape[1]
        w = rng.standard_normal((o, c, k, k)) * np.sqrt(2.0 / (c * k * k))
        return net.conv2d(x, w.astype(np.float32), stride=stride, padding=k // 2, name=name)

    def bn(x, name):
        c = x.shape[1]
        return net.batch_norm(x, np.ones(c, np.float32), np.zeros(c, np.float32),
                              np.zeros(c, np.float32), np.ones(c, np.float32), name=name)

    w2 = 2 * width
    x = net.input("x", (batch, 1, 8, 8))
    y = net.relu(bn(conv(x, width, 3, "conv1"), "bn1"), name="relu")
    # identity block
    h = net.relu(bn(conv(y, width, 3, "block1.conv1"), "block1.bn1"), name="block1.relu")
    h = bn(conv(h, width, 3, "block1.conv2"), "block1.bn2")
    y = net.relu(net.add(h, y, name="block1.add"), name="block1.relu_1")
    # stride-2 block with a projection shortcut
    h = net.relu(bn(conv(y, w2, 3, "block2.conv1", 2), "block2.bn1"), name="block2.relu")
    h = bn(conv(h, w2, 3, "block2.conv2"), "block2.bn2")
    s = bn(conv(y, w2, 1, "block2.downsample.0", 2), "block2.downsample.1")
    y = net.relu(net.add(h, s, name="block2.add"), name="block2.relu_1")
    y = net.relu(bn(conv(y, w2, 1, "conv_head"), "bn_head"), name="relu_head")
    y = net.flatten(net.global_avg_pool(y, name="avgpool"), name="flatten")
    fc = rng.standard_normal((10, w2)) * np.sqrt(1.0 / w2)
    net.output(net.linear(y, fc.astype(np.float32), np.zeros(10, np.float32), name="fc"))
    return net


def _bar(done, total, width=30, extra=""):
    k = int(width * done / total)
    sys.stderr.write(f"\r[{'#' * k}{'.' * (width - k)}] {done}/{total} {extra}")
    sys.stderr.flush()


def evaluate_accuracy(trainer: Trainer, x, y, seed=0) -> float:
    """Inference-mode accuracy (running statistics) with the reference evaluator."""
    from ..interpreter import evaluate

    net = digits_net(len(x), seed=seed, width=trainer.net.op("conv1").outputs[0].shape[1])
    sd = trainer.state_dict()
    for d in net.constants():
        d.value = None
        d.bind_constant(sd[d.name])
    logits = evaluate(net, x)[0]
    return float((logits.argmax(axis=1) == y).mean())


def train_digits(epochs: int = 12, batch: int = 64, lr: float = 0.1, schedule: str = "fused",
                 out: str | None = None, seed: int = 0, progress: bool = True) -> dict:
    """Train; return {"test_accuracy", "losses", "accuracies", "seconds", "plot"}."""
    xtr, ytr, xte, yte = load_digits_data(seed)
    net = digits_net(batch, seed)
    steps = len(xtr) // batch
    opt = SGD(lr, momentum=0.9, weight_decay=5e-4)
    tr = Trainer(net, opt, schedule=schedule)
    rng = np.random.default_rng(seed)
    losses, accs = [], []
    t0 = time.perf_counter()
    total = epochs * steps
    for ep in range(epochs):
        opt.lr = lr * 0.5 * (1 + np.cos(np.pi * ep / epochs))       # cosine decay per epoch
        perm = rng.permutation(len(xtr))
        ep_loss = 0.0
        for i in range(steps):
            idx = perm[i * batch:(i + 1) * batch]
            ep_loss += tr.step(xtr[idx], ytr[idx])
            if progress:
                _bar(ep * steps + i + 1, total, extra=f"epoch {ep + 1}/{epochs} loss {ep_loss / (i + 1):.3f}")
        losses.append(ep_loss / steps)
        accs.append(evaluate_accuracy(tr, xte, yte, seed))
        if progress:
            sys.stderr.write(f"  test acc {accs[-1] * 100:.1f}%\n")
    secs = time.perf_counter() - t0
    result = {"test_accuracy": accs[-1], "losses": losses, "accuracies": accs, "seconds": secs,
              "plot": None, "trainer": tr}
    if out:
        Path(out).mkdir(parents=True, exist_ok=True)
        np.savez(Path(out) / "digits_weights.npz", **tr.state_dict())
        result["plot"] = _plot(losses, accs, Path(out) / "digits_training.png")
    return result


def _plot(losses, accs, path):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: no plot (pip install matplotlib)", file=sys.stderr)
        return None
    fig, ax = plt.subplots(figsize=(6, 3.5))
    ep = np.arange(1, len(losses) + 1)
    ax.plot(ep, losses, "b-o", label="train loss")
    ax.set_xlabel("epoch")
    ax.set_ylabel("loss", color="b")
    ax2 = ax.twinx()
    ax2.plot(ep, np.array(accs) * 100, "r-s", label="test accuracy")
    ax2.set_ylabel("test accuracy (%)", color="r")
    ax.set_title("tilefuse: digits, fused schedule")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return str(path)
