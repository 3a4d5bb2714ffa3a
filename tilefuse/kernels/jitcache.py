"""Where numba keeps the compiled kernels: a folder named by a hash of the kernel sources.

numba's on-disk cache (`@njit(cache=True)`) checks only the source file of the cached function
itself. Most fast kernels inline helpers from other files (every conv kernel inlines
`conv/epilogue.py`'s stores, the epilogues inline `activations.py`), so after a helper changes
(a `git pull`, a branch switch, an edit) the cache still hands out machine code built from the
old helper: silently the old behaviour, or a crash. `configure()` runs once from
`tilefuse/__init__.py`, before any kernel is defined, and points numba's cache at

    $NUMBA_CACHE_DIR/tilefuse-<hash>        (NUMBA_CACHE_DIR set: it stays the root)
    ~/.cache/tilefuse/numba/tilefuse-<hash> (otherwise; $XDG_CACHE_HOME respected)

where <hash> covers every .py file of the packages that define numba kernels (`SOURCES`). Any
change there starts a fresh folder (the kernels compile again on first use); numba's own
per-function checks still apply inside it. TILEFUSE_JIT_CACHE=numba leaves numba's default
locations alone. Old folders are not removed (`tilefuse-*` under the root can be deleted any time).
"""
from __future__ import annotations

import hashlib
import os
from pathlib import Path

ENV = "TILEFUSE_JIT_CACHE"
SOURCES = ("kernels", "imaging", "training")      # packages under tilefuse/ with numba kernels
_ROOT = Path(__file__).resolve().parents[1]       # tilefuse/
_STATE: dict = {"configured": False, "dir": None, "reason": "not configured"}


def fingerprint() -> str:
    """sha1 (16 hex digits) over the relative paths and bytes of the kernel sources."""
    h = hashlib.sha1()
    for d in SOURCES:
        for p in sorted((_ROOT / d).rglob("*.py")):
            h.update(str(p.relative_to(_ROOT)).encode())
            h.update(b"\0")
            h.update(p.read_bytes())
    return h.hexdigest()[:16]


def configure() -> dict:
    """Point numba's cache at the folder of this source hash (idempotent); returns the state."""
    if _STATE["configured"]:
        return _STATE
    _STATE["configured"] = True
    if os.environ.get(ENV, "").strip().lower() == "numba":
        _STATE["reason"] = f"{ENV}=numba: numba's default cache locations"
        return _STATE
    root = os.environ.get("NUMBA_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "tilefuse", "numba")
    from numba.core import config
    path = os.path.join(root, "tilefuse-" + fingerprint())
    config.CACHE_DIR = path
    _STATE.update(dir=path, reason="keyed by the kernel sources")
    return _STATE


def info() -> dict:
    return dict(_STATE)
