"""Hidden-segment planner: intermediates whose lifetimes do not overlap share memory.

Lifetime of a hidden node = [index of its producing instruction, index of its last reader].
Blocks are placed largest first at the lowest aligned offset that does not collide with any
already placed block whose lifetime overlaps (a greedy best-fit, as in TFLite's arena planner).
An instruction's output never shares memory with its own inputs, since both are live at it.
"""
from __future__ import annotations

from dataclasses import dataclass

ALIGN = 64


def align(n: int, a: int = ALIGN) -> int:
    return (n + a - 1) // a * a


@dataclass
class MemoryPlan:
    offsets: dict[str, int]      # hidden node name -> offset in the hidden segment
    lifetimes: dict[str, tuple[int, int]]
    planned_bytes: int           # hidden segment size with sharing
    naive_bytes: int             # sum of all hidden blocks (no sharing)


def plan_hidden(blocks: dict[str, int], lifetimes: dict[str, tuple[int, int]]) -> MemoryPlan:
    """blocks: name -> nbytes; lifetimes: name -> (first, last) instruction index."""
    placed: list[tuple[int, int, int, int]] = []  # (offset, end, first, last)
    offsets: dict[str, int] = {}
    for name in sorted(blocks, key=lambda n: (-blocks[n], lifetimes[n][0], n)):
        size = align(blocks[name])
        first, last = lifetimes[name]
        busy = sorted((o, e) for o, e, f, l in placed if not (l < first or f > last))
        off = 0
        for o, e in busy:
            if off + size <= o:
                break
            off = max(off, e)
        offsets[name] = off
        placed.append((off, off + size, first, last))
    total = max((e for _, e, _, _ in placed), default=0)
    return MemoryPlan(offsets, dict(lifetimes), total, sum(align(b) for b in blocks.values()))
