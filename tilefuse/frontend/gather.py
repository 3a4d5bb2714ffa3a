"""Gathers with constant indices as the importers build them (ONNX Gather / GatherND, torch's `x[:, [2, 1, 0]]`
and `index_select`): the IR has no gather op, so the indices, in order, are cut into runs of evenly spaced
indices, each run one slice (consecutive: step 1; reversed, BGR <-> RGB: step -1; strided), the slices
concatenated along the axis. Exact: a slice copies values."""
from __future__ import annotations

# up to this many runs (VGG's 7x7 adaptive pool of an 8x8 map, as torch's dynamo exporter writes it, is 98 runs of 2)
MAX_RUNS = 256


def index_runs(ids: list[int]) -> list[range]:
    """The runs of `ids` (in range, at least one): a run's first two indices set its step (nonzero), and it goes on
    while the step holds; a repeated index starts a run of its own."""
    runs, k = [], 0
    while k < len(ids):
        j, step = k + 1, 1
        if j < len(ids) and ids[j] != ids[k]:
            step = ids[j] - ids[k]
            while j < len(ids) and ids[j] - ids[j - 1] == step:
                j += 1
        runs.append(range(ids[k], ids[j - 1] + (1 if step > 0 else -1), step))
        k = j
    return runs


def slice_args(idx: range) -> tuple[int, int | None, int]:
    """(start, stop, step) of the slice op taking the indices `idx` (a non-empty range) in order: the stop one step
    past the last index, None for a reversed one that ends at index 0 (-1 would be the end)."""
    step = idx.step if len(idx) > 1 else 1
    last = idx[-1]
    return idx.start, (last + 1 if step > 0 else (last - 1 if last > 0 else None)), step
