"""Past one machine: batch inference on a Ray cluster, constants copied once per worker.

    from tilefuse.distributed import run_many, Pool, Predictor
    ys = run_many(package, xs, workers=4, batch=16)        # a pool of Ray actors, outputs in order

`Pool` / `run_many` (pool.py): actors each holding one Session on a package put once into Ray's
object store; bounded in-flight work, worker replacement, per-input failures by index.
`Predictor` (predictor.py): a callable class for `ray.data.Dataset.map_batches`.
`BatchRunner` (runner.py): what a worker does with a batch, also used in-process (`--workers 0`).
`images.py`: PNG/JPEG decoding, resizing, normalizing, top-k, for `tilefuse batch` (cli.py).

Ray (and Pillow for images) come with `pip install 'tilefuse[distributed]'`; this package imports
Ray only when a pool is made, so `import tilefuse` never needs it. See docs/distributed.md.
"""
from .pool import Pool, RunStats, WorkerLost, WorkerStats, connect, import_ray, put_package, run_many
from .predictor import Predictor
from .runner import BatchRunner, DistributedError, InputErrors, InputFailure, run_samples

__all__ = ["Pool", "run_many", "Predictor", "BatchRunner", "RunStats", "WorkerStats", "InputFailure",
           "InputErrors", "WorkerLost", "DistributedError", "connect", "import_ray", "put_package",
           "run_samples"]
