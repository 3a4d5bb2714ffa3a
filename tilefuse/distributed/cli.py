"""`tilefuse batch`: classify a folder of PNG/JPEG files, in this process or on a Ray cluster.

    tilefuse batch MODEL_OR_PACKAGE INPUT_DIR -o predictions.csv [--workers N] [--address ADDR]
                   [--image-size 224] [--top-k 5] [--mean R,G,B --std R,G,B] [--resize crop|stretch]
                   [--labels FILE] [--chunk 16] [--threads T] [--batch N]

MODEL_OR_PACKAGE is a .tfpkg file or a zoo model name (compiled here with --image-size and
--batch). Files under INPUT_DIR (recursively, *.png *.jpg *.jpeg in any case) are read in sorted
order; each is decoded, resized and normalized (ImageNet mean/std by default) on the worker that
runs it, and gets one CSV row: file, top-k classes and scores (softmax of the outputs, unless the
network ends in a softmax), and an error column saying why a file could not be used. The other
files complete either way; the exit status is 1 when some file failed, 0 when none did.

--workers 0 (the default without --address) runs in this process: no Ray needed. --workers N
starts N Ray actors (a local Ray cluster, or the one at --address: "auto", "HOST:6379" or
"ray://HOST:10001"); with --address and no --workers, one worker per --threads CPUs of the cluster.
Ray is needed only then (pip install 'tilefuse[distributed]').
"""
from __future__ import annotations

import argparse
import csv
import os
import sys
import time
from pathlib import Path

from ..errors import TilefuseError
from .images import IMAGE_SUFFIXES, RESIZE_MODES, ImagePreprocess, TopK
from .runner import DistributedError, InputFailure, sample_slot


def register(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser("batch", help="classify a folder of PNG/JPEG images into a CSV (Ray optional)",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("model", metavar="MODEL_OR_PACKAGE", help="a .tfpkg file or a zoo model name")
    p.add_argument("input_dir", metavar="INPUT_DIR", help="folder of .png / .jpg / .jpeg files (recursive)")
    p.add_argument("-o", "--output", required=True, help="CSV file to write")
    p.add_argument("--workers", type=int, default=None,
                   help="Ray workers; 0 = this process, no Ray (default: 0, or the cluster's CPUs with --address)")
    p.add_argument("--address", default=None, help="Ray cluster: auto, HOST:PORT or ray://HOST:10001")
    p.add_argument("--image-size", type=int, default=None,
                   help="model input H = W (zoo models; a package's own size is checked against it)")
    p.add_argument("--batch", type=int, default=1, help="images per model input when compiling a zoo model")
    p.add_argument("--top-k", type=int, default=5)
    p.add_argument("--mean", default=None, help="per-channel mean, e.g. 0.485,0.456,0.406 (ImageNet by default)")
    p.add_argument("--std", default=None, help="per-channel std, e.g. 0.229,0.224,0.225 (ImageNet by default)")
    p.add_argument("--resize", choices=RESIZE_MODES, default="crop",
                   help="crop: shorter side to the size, centre square (default); stretch: both sides")
    p.add_argument("--scores", choices=("auto", "softmax", "raw"), default="auto",
                   help="auto: softmax unless the network ends in one")
    p.add_argument("--labels", default=None, help="text file, one class name per line (default: class index)")
    p.add_argument("--chunk", type=int, default=16, help="images per task sent to a worker")
    p.add_argument("--threads", type=int, default=None,
                   help="kernel threads per worker (default 1 per Ray worker; all cores with --workers 0)")
    p.add_argument("--seed", type=int, default=0, help="weights seed for zoo models")
    p.add_argument("--progress", action="store_true", help="progress bar on stderr (default: when a terminal)")
    p.set_defaults(func=run)
    return p


def _floats(text: str | None, what: str):
    if text is None:
        return None
    try:
        return tuple(float(v) for v in text.split(","))
    except ValueError:
        raise DistributedError(f"--{what} must be comma-separated numbers, got {text!r}") from None


def list_images(root: Path) -> list[Path]:
    if not root.is_dir():
        raise DistributedError(f"input folder {root} does not exist or is not a folder")
    files = sorted((p for p in root.rglob("*") if p.suffix.lower() in IMAGE_SUFFIXES and p.is_file()),
                   key=lambda p: p.relative_to(root).as_posix())
    if not files:
        raise DistributedError(f"no {'/'.join(IMAGE_SUFFIXES)} files under {root}")
    return files


def read_files(root: Path, files):
    """(relative name, bytes) per file, lazily; a file that cannot be read carries its OSError."""
    for p in files:
        name = p.relative_to(root).as_posix()
        try:
            yield name, p.read_bytes()
        except OSError as e:
            yield name, OSError(f"cannot read file: {e.strerror or e}")


def load_model(args):
    import tilefuse
    if args.model.endswith(".tfpkg") or os.path.isfile(args.model):
        return tilefuse.load_package(args.model)
    from .. import models
    if args.model.lower() not in models.NAMES:
        raise DistributedError(f"'{args.model}' is neither a .tfpkg file nor a zoo model "
                               f"({', '.join(models.NAMES)})")
    kw = {"seed": args.seed, "batch": args.batch}
    if args.image_size:
        kw["image_size"] = args.image_size
    return tilefuse.compile(models.get(args.model, **kw)).package


def read_labels(path, classes: int) -> list[str]:
    try:
        labels = [ln.strip() for ln in Path(path).read_text(encoding="utf-8").splitlines() if ln.strip()]
    except (OSError, UnicodeDecodeError) as e:
        raise DistributedError(f"cannot read labels file {path}: {e}") from None
    if len(labels) < classes:
        raise DistributedError(f"labels file {path} has {len(labels)} names, the model has {classes} classes")
    return labels


def ends_in_softmax(pkg) -> bool:
    prog = pkg.program()
    return bool(prog) and prog[-1].kernel == "softmax"


def run(args) -> int:
    root = Path(args.input_dir)
    files = list_images(root)
    pkg = load_model(args)
    slot, _ = sample_slot(pkg)
    if len(slot.shape) != 4 or slot.shape[2] != slot.shape[3]:
        raise DistributedError(f"'{pkg.name}' takes input {tuple(slot.shape)}, expected (N, C, S, S) images")
    if len(pkg.outputs) != 1:
        raise DistributedError(f"'{pkg.name}' has {len(pkg.outputs)} outputs, top-k needs one")
    size, channels = int(slot.shape[2]), int(slot.shape[1])
    if args.image_size and args.image_size != size:
        raise DistributedError(f"--image-size {args.image_size}, but the package takes {size}x{size} images")
    classes = 1
    for d in pkg.outputs[0].shape[1:]:
        classes *= int(d)
    labels = read_labels(args.labels, classes) if args.labels else None
    softmax = {"softmax": True, "raw": False}.get(args.scores, not ends_in_softmax(pkg))
    prep = ImagePreprocess(size, channels, _floats(args.mean, "mean"), _floats(args.std, "std"), args.resize)
    post = TopK(min(args.top_k, classes), softmax)
    if args.chunk < 1:
        raise DistributedError(f"--chunk must be >= 1, got {args.chunk}")
    progress = args.progress or sys.stderr.isatty()
    workers = args.workers
    if workers is not None and workers < 0:
        raise DistributedError(f"--workers must be >= 0, got {workers}")
    items = read_files(root, files)

    t0 = time.perf_counter()
    pool = None
    if workers == 0 or (workers is None and args.address is None):
        from .runner import BatchRunner
        runner = BatchRunner(pkg, threads=args.threads, samples=True, preprocess=prep, postprocess=post)
        results = _in_process(runner, items, args.chunk, len(files), progress)
        where = "in this process"
    else:
        from .pool import Pool, connect, import_ray
        try:
            ray = import_ray()
        except DistributedError as e:
            raise DistributedError(f"--workers {workers if workers is not None else 'auto'} runs on Ray: {e}. "
                                   f"--workers 0 runs in this process without Ray") from None
        threads = args.threads or 1
        if workers is None:
            connect(args.address)
            workers = max(1, int(ray.cluster_resources().get("CPU", 1)) // threads)
        pool = Pool(pkg, workers, threads, address=args.address, samples=True,
                    preprocess=prep, postprocess=post)
        stream = pool.imap(items, batch=args.chunk, progress=progress, total=len(files))
        results = (r for _, r in stream)
        where = f"on {workers} Ray workers x {threads} thread{'s' if threads > 1 else ''}"
    try:
        n_ok, failed = _write_csv(Path(args.output), files, root, results, post.k, labels)
    finally:
        results.close()
        if pool is not None:
            stream.close()
            pool.close()
    dt = time.perf_counter() - t0
    print(f"{len(files)} files {where} in {dt:.2f} s ({len(files) / max(dt, 1e-9):.1f} images/s): "
          f"{n_ok} classified, {len(failed)} could not be used; wrote {args.output}")
    if pool is not None:
        print(pool.stats.summary())
    for name, err in failed[:20]:
        print(f"  {_shown(name)}: {_shown(err)}", file=sys.stderr)
    if len(failed) > 20:
        print(f"  ... and {len(failed) - 20} more (see the error column)", file=sys.stderr)
    return 1 if failed else 0


def _shown(text) -> str:
    """A file's name or a decoder's message for the terminal: control characters escaped."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in str(text))


def _in_process(runner, items, chunk: int, total: int, progress: bool):
    from ..runtime.stages import Progress
    bar = Progress(total, "tilefuse batch") if progress else None
    start, batch = 0, []
    try:
        for item in items:
            batch.append(item)
            if len(batch) == chunk:
                yield from runner.run_batch(start, batch)[0]
                start += len(batch)
                batch = []
                if bar:
                    bar.update(chunk)
        if batch:
            yield from runner.run_batch(start, batch)[0]
            if bar:
                bar.update(len(batch))
    finally:
        if bar:
            bar.close()


def _write_csv(path: Path, files, root: Path, results, k: int, labels):
    """One row per file, in file order, written as results arrive; into place at the end."""
    tmp = path.with_name(path.name + ".tmp")
    failed: list[tuple[str, str]] = []
    n_ok = 0
    try:
        with open(tmp, "w", newline="", encoding="utf-8") as f:
            w = csv.writer(f)
            w.writerow(["file"] + [c for j in range(1, k + 1) for c in (f"class_{j}", f"score_{j}")] + ["error"])
            for p, r in zip(files, results):
                name = p.relative_to(root).as_posix()
                if isinstance(r, InputFailure):
                    err = r.error.split(": ", 1)[1] if r.error.startswith("ImageError: ") else r.error
                    failed.append((name, err))
                    w.writerow([name] + [""] * (2 * k) + [err])
                    continue
                idx, scores = r
                row = [name]
                for c, s in zip(idx, scores):
                    row += [labels[c] if labels else int(c), f"{float(s):.6g}"]
                w.writerow(row + [""] * (2 * k + 1 - len(row)) + [""])   # fewer classes than k: blanks
                n_ok += 1
        tmp.replace(path)
    except OSError as e:                     # the output file, not the images (those become rows)
        tmp.unlink(missing_ok=True)
        raise TilefuseError(f"cannot write {path}: {e}") from None
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return n_ok, failed
