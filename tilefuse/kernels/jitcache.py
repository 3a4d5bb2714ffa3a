"""Where numba keeps the compiled kernels: a folder named by a hash of the kernel sources.

numba's on-disk cache (`@njit(cache=True)`) checks only the source file of the cached function
itself. Most fast kernels inline helpers from other files (every conv kernel inlines
`conv/epilogue.py`'s stores, the epilogues inline `activations.py`), so after a helper changes
(a `git pull`, a branch switch, an edit) the cache still hands out machine code built from the
old helper: silently the old behaviour, or a crash. `configure()` runs once from
`tilefuse/__init__.py`, before any kernel is defined, and points numba's cache at

    $NUMBA_CACHE_DIR/tilefuse-<hash>        (NUMBA_CACHE_DIR set: it stays the root)
    ~/.cache/tilefuse/numba/tilefuse-<hash> (otherwise; $XDG_CACHE_HOME respected)

where <hash> covers every .py file of the packages that define numba kernels (`SOURCES`) and the
settings frozen into them (`BUILD_ENV`: TILEFUSE_ASM_TILES). Any
change there starts a fresh folder (the kernels compile again on first use); numba's own
per-function checks still apply inside it. The hash is taken when tilefuse is imported, but numba
compiles (and caches) a kernel at its first call, possibly much later, from the code the process
imported then: a module imported lazily after the sources were edited (a `git pull` beside a
running server, an edit during a long test run) would put the new code's machine code into the old
sources' folder, and a later process would load it as the old code's. So `configure()` also
records each source file's size and modification time, and numba's cache writes check them
(`guard_cache_writes()`): once a source has changed, this process stops writing cache entries (it
warns once; its kernels still compile and run in memory). TILEFUSE_JIT_CACHE=numba leaves numba's default
locations alone. Old folders are not removed (`tilefuse-*` under the root can be deleted any time).

Loading a cached kernel: numba keeps, besides the machine code, the kernel's LLVM module parsed
in memory (`_shared_module`: the IR other functions link in when they call the kernel) for the
life of the process. For the fused-epilogue kernels that IR is 3-5 MiB of heap per kernel
(each carries the activation loops of `conv/epilogue.py`), and it is used only when a function
compiled later calls the kernel. `configure()` also installs `lazy_linking_modules()`: a
kernel loaded from the cache keeps the module's bitcode bytes (what the cache file holds) and
parses it only when something links against it. The machine code and the symbols are numba's,
unchanged; TILEFUSE_JIT_CACHE=numba leaves this alone too. The module is still parsed once at
load (numba lists its symbols from it) and freed; glibc keeps the freed pages resident in the
loading thread's malloc arena, where little reuses them (a pipeline stage's thread loads its
kernels at the first call: ~10 MiB per stage thread at VGG 4K, pipe2), so the loader hands them
back to the OS right away (`malloc_trim`, where the C library is glibc).
"""
from __future__ import annotations

import hashlib
import os
from pathlib import Path

ENV = "TILEFUSE_JIT_CACHE"
SOURCES = ("kernels", "imaging", "training")      # packages under tilefuse/ with numba kernels
BUILD_ENV = ("TILEFUSE_ASM_TILES",)               # tiles.ASM_AVX2's switch
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
    # settings that the kernels freeze in as compile-time constants and numba's own cache key does
    # not see (the vector width does change numba's key: it is a CPU feature)
    for env in BUILD_ENV:
        h.update(f"{env}={os.environ.get(env, '').strip()}".encode())
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
    _STATE.update(dir=path, reason="keyed by the kernel sources", lazy_linking=lazy_linking_modules(),
                  stamps=stamps(), guarded=guard_cache_writes())
    return _STATE


def stamps() -> tuple:
    """(relative path, size, mtime in ns) of every kernel source file: what `fingerprint()` hashed."""
    out = []
    for d in SOURCES:
        for p in sorted((_ROOT / d).rglob("*.py")):
            st = p.stat()
            out.append((str(p.relative_to(_ROOT)), st.st_size, st.st_mtime_ns))
    return tuple(out)


def sources_changed() -> bool:
    """Have the kernel sources changed on disk since `configure()` hashed them?"""
    return _STATE.get("stamps") is not None and stamps() != _STATE["stamps"]


def guard_cache_writes() -> bool:
    """numba's cache writes are skipped once the kernel sources changed since `configure()` (see the
    module docstring). Idempotent; False where numba's cache class lacks `save_overload`."""
    try:
        from numba.core.caching import Cache
    except ImportError:
        return False
    orig = getattr(Cache, "save_overload", None)
    if orig is None:
        return False
    if getattr(orig, "_tilefuse_guard", False):
        return True

    def save_overload(self, sig, data):
        mine = str(getattr(self, "_cache_path", "")).startswith(str(_STATE.get("dir")))  # our folder only
        if mine and (_STATE.get("stale") or sources_changed()):
            if not _STATE.get("stale"):
                _STATE["stale"] = True
                import warnings
                warnings.warn(f"tilefuse: the kernel sources under {_ROOT} changed after this process "
                              f"started; its kernels compile from the code it imported and are not "
                              f"written to the cache folder {_STATE['dir']} (restart the process to cache "
                              f"the new code)", RuntimeWarning, stacklevel=2)
            return None
        return orig(self, sig, data)

    save_overload._tilefuse_guard = True
    Cache.save_overload = save_overload
    return True


_TRIM: list = []


def _trim_heap() -> None:
    """Return the free pages of every malloc arena to the OS (glibc's malloc_trim); a no-op where
    the C library has no malloc_trim."""
    if not _TRIM:
        fn = None
        try:
            import ctypes
            fn = getattr(ctypes.CDLL(None), "malloc_trim", None)      # the process's C library
            if fn is not None:
                fn.argtypes, fn.restype = [ctypes.c_size_t], ctypes.c_int
        except (OSError, AttributeError):
            fn = None
        _TRIM.append(fn)
    if _TRIM[0] is not None:
        _TRIM[0](0)


def lazy_linking_modules() -> bool:
    """Cached kernels keep their linking IR as bitcode bytes, parsed on first link (see the module
    docstring). Idempotent; False (numba untouched) where numba's code library does not have the
    expected form."""
    try:
        import llvmlite.binding as ll
        from numba.core import codegen as cg
        lib_cls, orig = cg.JITCodeLibrary, cg.CPUCodeLibrary._unserialize
        orig_linking = cg.CPUCodeLibrary._get_module_for_linking
    except (ImportError, AttributeError):
        return False
    if getattr(lib_cls, "_tilefuse_lazy_linking", False):
        return True
    import inspect
    try:
        src = inspect.getsource(orig)
    except (OSError, TypeError):   # numba installed without its sources: cannot check, leave it alone
        return False
    if "_shared_module = ll.parse_bitcode(shared_bitcode)" not in src:
        return False        # another numba: its loader may do more than this one; leave it alone

    def _unserialize(cls, codegen, state):
        name, kind, data = state
        if kind != "object":
            return orig.__func__(cls, codegen, state)
        object_code, shared_bitcode = data
        self = codegen.create_library(name)
        self.enable_object_caching()
        self._set_compiled_object(object_code)
        self._tilefuse_bitcode = shared_bitcode
        self._finalize_final_module()
        # numba's loader, without keeping the parsed module (self._shared_module stays None)
        self._codegen._engine._load_defined_symbols(ll.parse_bitcode(shared_bitcode))
        _trim_heap()
        return self

    def _get_module_for_linking(self):
        if self._shared_module is None and getattr(self, "_tilefuse_bitcode", None) is not None:
            return ll.parse_bitcode(self._tilefuse_bitcode)   # a fresh module per link (linked with preserve)
        return orig_linking(self)

    lib_cls._unserialize = classmethod(_unserialize)
    lib_cls._get_module_for_linking = _get_module_for_linking
    lib_cls._tilefuse_lazy_linking = True
    return True


def info() -> dict:
    return dict(_STATE)
