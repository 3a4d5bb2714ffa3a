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
