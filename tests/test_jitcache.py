"""numba's kernel cache is keyed by the kernel sources (kernels/jitcache.py): a change to a helper
that other kernels inline (conv/epilogue.py) must not leave their old machine code in use."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PROBE = ("import tilefuse, numpy as np\n"
         "from numba.core import config\n"
         "from tilefuse.kernels import elementwise\n"
         "x = np.ones((1, 16, 4, 4), np.float32)\n"
         "elementwise.relu(np.empty_like(x), x, threads=1)\n"
         "print(config.CACHE_DIR)\n")


def _cache_dir(pkg_root: Path, cache: Path, **env) -> str:
    e = {k: v for k, v in os.environ.items() if k != "TILEFUSE_JIT_CACHE"}
    e.update(NUMBA_CACHE_DIR=str(cache), PYTHONPATH=str(pkg_root), **env)
    r = subprocess.run([sys.executable, "-c", PROBE], env=e, capture_output=True, text=True, timeout=300,
                       cwd=str(pkg_root))
    assert r.returncode == 0, r.stderr[-2000:]
    return r.stdout.strip().splitlines()[-1]


def test_cache_folder_changes_with_any_kernel_source(tmp_path):
    pkg = tmp_path / "src"
    shutil.copytree(ROOT / "tilefuse", pkg / "tilefuse",
                    ignore=shutil.ignore_patterns("__pycache__", "*.nbi", "*.nbc"))
    cache = tmp_path / "numba"
    first = _cache_dir(pkg, cache)
    assert first.startswith(str(cache / "tilefuse-")), first
    assert any(Path(first).rglob("*.nbi")), "the kernels' cache files go into the keyed folder"
    assert _cache_dir(pkg, cache) == first                       # same sources: same folder (reused)
    epi = pkg / "tilefuse" / "kernels" / "conv" / "epilogue.py"
    epi.write_text(epi.read_text() + "\n# a change to an inlined helper\n")
    second = _cache_dir(pkg, cache)
    assert second != first and second.startswith(str(cache / "tilefuse-"))


def test_opt_out_keeps_numbas_default(tmp_path):
    out = _cache_dir(ROOT, tmp_path / "numba", TILEFUSE_JIT_CACHE="numba")
    assert out == str(tmp_path / "numba")                        # numba's own NUMBA_CACHE_DIR, unkeyed


LINK_PROBE = ("import sys, numpy as np, tilefuse\n"
              "from tilefuse.kernels import jitcache\n"
              "sys.path.insert(0, sys.argv[1])\n"
              "import numba, kmod\n"
              "assert jitcache.info()['lazy_linking'] is True\n"
              "x = np.arange(8, dtype=np.float32)\n"
              "y = kmod.twice(x)\n"
              "lib = kmod.twice.overloads[kmod.twice.signatures[0]].library\n"
              "print('loaded', kmod.twice.stats.cache_hits.most_common(1), lib._shared_module is None)\n"
              "@numba.njit(cache=False)\n"
              "def caller(a):\n"
              "    return kmod.twice(a) + 1.0\n"
              "print('linked', float(caller(x).sum()), float(y.sum()))\n")


def test_cached_kernel_links_lazily(tmp_path):
    """A kernel loaded from the cache keeps no parsed LLVM module (`lazy_linking_modules`), and a
    function compiled later that calls it still links it (parsed then) and computes the same."""
    (tmp_path / "kmod.py").write_text("import numba\n\n@numba.njit(cache=True)\ndef twice(a):\n"
                                      "    return a * 2.0\n")
    e = {k: v for k, v in os.environ.items() if k != "TILEFUSE_JIT_CACHE"}
    e.update(NUMBA_CACHE_DIR=str(tmp_path / "numba"), PYTHONPATH=str(ROOT))
    outs = []
    for _ in range(2):                       # the first run compiles and saves, the second loads
        r = subprocess.run([sys.executable, "-c", LINK_PROBE, str(tmp_path)], env=e, capture_output=True,
                           text=True, timeout=300, cwd=str(tmp_path))
        assert r.returncode == 0, r.stderr[-2000:]
        outs.append(r.stdout.split("\n"))
    assert outs[0][0].endswith("False")                      # compiled here: numba's own module kept
    assert outs[1][0].endswith("True") and "1)" in outs[1][0], outs[1][0]   # loaded: no parsed module
    assert outs[0][1] == outs[1][1] == f"linked {2 * 28.0 + 8.0} 56.0"


def test_trim_heap_is_safe_to_call():
    """The loader's heap release (glibc malloc_trim; a no-op elsewhere) runs and leaves data alone."""
    import sys as _sys

    import numpy as np

    from tilefuse.kernels import jitcache
    a = np.arange(1 << 20, dtype=np.float32)
    jitcache._trim_heap()
    jitcache._trim_heap()
    assert float(a[-1]) == float((1 << 20) - 1)
    if _sys.platform.startswith("linux"):
        assert jitcache._TRIM and jitcache._TRIM[0] is not None


STALE_PROBE = ("import sys, warnings, numpy as np, tilefuse\n"
               "from pathlib import Path\n"
               "from tilefuse.kernels import elementwise, jitcache\n"
               "if sys.argv[1] == 'edit':\n"
               "    epi = Path(tilefuse.__file__).parent / 'kernels' / 'conv' / 'epilogue.py'\n"
               "    epi.write_text(epi.read_text() + '\\n# edited while the process runs\\n')\n"
               "x = np.full((1, 16, 4, 4), -2.0, np.float32)\n"
               "with warnings.catch_warnings(record=True) as w:\n"
               "    warnings.simplefilter('always')\n"
               "    y = np.empty_like(x)\n"
               "    elementwise.relu(y, x, threads=1)\n"
               "print(jitcache.info()['dir'])\n"
               "print(float(y.max()), jitcache.info().get('stale', False), any('changed after' in str(m.message) for m in w))\n")


def test_no_cache_writes_after_the_sources_changed(tmp_path):
    """A process whose kernel sources are edited after it started (its cache folder is keyed by the
    old sources) compiles and runs its kernels but writes none of them to the cache, and says so;
    the same process without the edit writes them (the check can fail)."""
    pkg = tmp_path / "src"
    shutil.copytree(ROOT / "tilefuse", pkg / "tilefuse",
                    ignore=shutil.ignore_patterns("__pycache__", "*.nbi", "*.nbc"))
    e = {k: v for k, v in os.environ.items() if k != "TILEFUSE_JIT_CACHE"}
    e["PYTHONPATH"] = str(pkg)
    found = {}
    for mode in ("keep", "edit"):
        e["NUMBA_CACHE_DIR"] = str(tmp_path / f"numba_{mode}")
        r = subprocess.run([sys.executable, "-c", STALE_PROBE, mode], env=e, capture_output=True, text=True,
                           timeout=300, cwd=str(pkg))
        assert r.returncode == 0, r.stderr[-2000:]
        folder, line = r.stdout.strip().splitlines()[-2:]
        found[mode] = (sorted(p.name for p in Path(folder).rglob("*.nb*")), line)
    assert found["keep"][0] and found["keep"][1] == "0.0 False False", found["keep"]
    assert found["edit"][0] == [] and found["edit"][1] == "0.0 True True", found["edit"]
