"""Streaming for large images (issue 6, seed 003): the user's conveniences over the row-band schedule.

    from tilefuse.stream import compile_stream
    s = compile_stream(net, band_rows=4)           # = tilefuse.compile(net, schedule="stream", ...)
    y = s.run(x)                                    # a Session of it (s.session()), as any CompiledNetwork
    print(s.plan())                                 # instructions, then rows held per layer, bytes, stages

The schedule is a compiler stage (`compiler/bands.py`, `compiler/streaming.py`: band
instructions, ring buffers in the hidden segment) and its execution a mode of the runtime
(`runtime/streaming.py`); kernels on bands are `kernels/bands.py`. This package keeps the
helpers for large images: `netutil.py` (a new input size, the fully convolutional trunk) and
`cli.py` (`tilefuse run --schedule stream`). `docs/streaming.md` has the details and numbers.
"""
from __future__ import annotations

from ..compiler.compile import CompiledNetwork, compile


def compile_stream(net, band_rows: int = 4, workers: int = 1, *, passes=None, queue_bands: int = 2,
                   band_mode: str = "layer", layer_rows=None, threads: int | None = None, winograd: bool = True,
                   algorithm: str | None = None, layout: str = "nchwc", min_band_pixels: int = 0,
                   tune: bool = False) -> CompiledNetwork:
    """`tilefuse.compile(net, schedule="stream", ...)` with the stream options as arguments.

    band_rows: output rows each layer computes per step (1 = the paper's row-by-row line
        buffer). Default 4: the fast conv kernels need a few rows per call (Winograd F(4,3)
        computes 4-row tiles) and 4 keeps the ResNet18 trunk at 4K above 10x less activation
        memory than layer by layer; 8 is ~10-20% faster and holds ~1.6x the rows.
    workers: 1 = one thread stream, each band's conv on all cores (`threads`); >1 = the layer
        pipeline, the streamed layers cut into `workers` stages of balanced estimated time, one
        thread each, kernels single-threaded.
    queue_bands: extra bands of ring capacity on tensors that cross a stage boundary.
    band_mode: "layer" (default): every layer computes `band_rows` output rows per step (its
        first step may be shorter, which aligns it with its producer's bands); "input": rows are
        fed `band_rows` at a time and every layer emits as many rows as its inputs allow (the
        first version; after k stride-2 layers a step has band_rows / 2**k rows).
    layer_rows: with band_mode "layer", a function StreamLayer -> rows per step overriding
        band_rows per layer.
    threads: the session's kernel threads (None: all cores; workers=1 only).
    winograd, algorithm, tune: the algorithm pass (compiler/algorithms.py), as for layer by
        layer; algorithm="reference" runs the reference conv on every band.
    layout: "nchwc" (default): rings between layers that run blocked hold NCHW16c rows and the
        convs call the blocked kernels with no layout conversion per band; "nchw": every ring
        NCHW and every conv band through `conv2d_run` (the first version).
    min_band_pixels: band_mode "layer" without layer_rows: a layer whose band_rows x output
        width is below this doubles its rows per step (at most 4x band_rows), so narrow deep
        layers get enough Winograd tiles per call. 0 (default): off.
    """
    opts = {"band_rows": band_rows, "workers": workers, "queue_bands": queue_bands, "band_mode": band_mode,
            "layer_rows": layer_rows, "layout": layout, "min_band_pixels": min_band_pixels}
    return compile(net, schedule="stream", passes=passes, winograd=winograd, algorithm=algorithm, threads=threads,
                   tune=tune, layout="nchw" if layout == "nchw" else "auto", stream_options=opts)


__all__ = ["compile_stream"]
