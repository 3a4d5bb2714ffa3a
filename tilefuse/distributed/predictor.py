"""`Predictor`: tilefuse inside a Ray Data pipeline, the way other model runners plug in.

    import ray, tilefuse
    from tilefuse.distributed import Predictor, put_package
    ref = put_package(tilefuse.load_package("resnet50.tfpkg"))     # once, into the object store
    ds = ray.data.read_images("/data/imgs", size=(224, 224), mode="RGB")
    ds = ds.map_batches(Predictor, fn_constructor_kwargs={"package": ref, "normalize": "imagenet",
                                                          "top_k": 5},
                        concurrency=4, batch_size=64, num_cpus=1)
    ds.write_csv("/data/out")     # or .take(), .iter_batches() ...

Ray Data starts `concurrency` actors of this class; each resolves the package reference (one
shared copy per node), validates it, copies the constants to its own device once and keeps its
Session for every batch it gets. Each row of `column` is one sample: the package's input shape
without the batch dimension, or with `normalize` an (H, W, C) uint8 image that is normalized
(x / 255 - mean) / std and made CHW first. Rows are packed into the package's batch. The output
column holds each row's output (or, with top_k, `classes` and `scores` columns); the other
columns pass through, the input column is dropped. A row that fails (wrong shape) fails the batch
with an error naming the row, since Ray Data has no per-row error channel.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from .images import IMAGENET_MEAN, IMAGENET_STD, TopK, normalize as normalize_pixels
from .runner import BatchRunner, DistributedError, InputFailure


class Predictor:
    def __init__(self, package, *, column: str = "image", output_column: str = "output",
                 threads: int | None = 1, depth: int = 3, normalize=None, top_k: int | None = None,
                 softmax: bool = True):
        if _is_object_ref(package):
            from .pool import import_ray
            package = import_ray().get(package)
        if normalize == "imagenet":
            normalize = (IMAGENET_MEAN, IMAGENET_STD)
        elif normalize is not None and (not isinstance(normalize, (tuple, list)) or len(normalize) != 2):
            raise ValueError(f"normalize must be None, 'imagenet' or (mean, std), got {normalize!r}")
        self.column, self.output_column = column, output_column
        self.normalize = normalize
        self.topk = TopK(top_k, softmax) if top_k else None
        self.runner = BatchRunner(package, threads=threads, depth=depth, samples=True,
                                  preprocess=self._prepare)

    def _prepare(self, row) -> np.ndarray:
        if self.normalize is None:
            return row
        return normalize_pixels(row, *self.normalize)

    def __call__(self, batch: dict[str, Any]) -> dict[str, Any]:
        if self.column not in batch:
            raise DistributedError(f"Predictor: the batch has no column '{self.column}' "
                                   f"(columns: {', '.join(batch)})")
        rows = list(batch[self.column])
        results, _ = self.runner.run_batch(0, rows)
        bad = [r for r in results if isinstance(r, InputFailure)]
        if bad:
            raise DistributedError(f"Predictor: {len(bad)} of {len(rows)} rows of this batch failed: "
                                   + "; ".join(f"row {f.index}: {f.error}" for f in bad[:5]))
        out = {k: v for k, v in batch.items() if k != self.column}
        if self.topk is not None:
            picked = [self.topk(y) for y in results]
            out["classes"] = np.stack([c for c, _ in picked])
            out["scores"] = np.stack([s for _, s in picked])
        else:
            out[self.output_column] = np.stack(results)
        return out


def _is_object_ref(x) -> bool:
    return type(x).__name__ in ("ObjectRef", "ClientObjectRef") and type(x).__module__.startswith("ray")
