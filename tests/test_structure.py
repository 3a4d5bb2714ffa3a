"""The package's shape: no import cycle, no import "up" the pipeline, named op groups.

Imports are read with `ast` from the source (every `import` / `from ... import`, also those
inside functions: a lazy import is still a dependency), so the checks need no import side
effects. The checker is tested on a small synthetic package first, so it can be seen to fail.

Layers of the core pipeline, lowest first: errors, kernels, ir, compiler, runtime. A core
module imports only from its own layer or lower ones (so kernels import nothing from ir,
compiler, runtime, frontend, ...; ir nothing from compiler, runtime, frontend, ...). The other
parts (stream, training, imaging, frontend, models, cli, ...) may import any core layer, but no
two parts (core or not) may import each other in a cycle. `ALLOWED` lists the known exceptions,
each with its reason.

The numba kernels' floating-point flags are read the same way (`inherited_fastmath`): an njit function that a
fastmath kernel calls states its own `fastmath`, or numba would compile it with its first caller's flags.
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
CORE = ("errors", "kernels", "ir", "compiler", "runtime")
# (importing module, imported package or module): why it is allowed
ALLOWED: dict = {}


def module_names(root: Path, package: str) -> dict[str, Path]:
    """Dotted module name -> file, for every .py under root/package."""
    out = {}
    for f in sorted((root / package).rglob("*.py")):
        parts = list(f.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = f
    return out


def imports(root: Path, package: str) -> list[tuple[str, str, int]]:
    """(importer, imported module, line) for every import of `package` inside it."""
    mods = module_names(root, package)
    edges = []
    for name, f in mods.items():
        tree = ast.parse(f.read_text(), str(f))
        is_pkg = f.name == "__init__.py"
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = name.split(".") if is_pkg else name.split(".")[:-1]
                    base = base[:len(base) - (node.level - 1)]
                    mod = ".".join(base + ([node.module] if node.module else []))
                else:
                    mod = node.module or ""
                targets = [f"{mod}.{a.name}" if f"{mod}.{a.name}" in mods else mod for a in node.names]
            else:
                continue
            for t in targets:
                # the longest known module the target names ("a.b.c" -> "a.b" if only that exists)
                while t and t not in mods:
                    t = t.rpartition(".")[0]
                if t and t != name and (t == package or t.startswith(package + ".")):
                    edges.append((name, t, node.lineno))
    return edges


def part(module: str, package: str) -> str:
    """The top-level part a module belongs to: tilefuse.kernels.conv.direct -> kernels."""
    rest = module[len(package) + 1:]
    return rest.split(".")[0] if rest else package


def _allowed(src: str, dst: str, allowed) -> bool:
    return any(src == a and (dst == b or dst.startswith(b + ".")) for a, b in allowed)


def find_cycle(nodes, edges) -> list[str] | None:
    """One cycle of the directed graph, or None."""
    graph = {n: sorted({b for a, b in edges if a == n and b != n}) for n in nodes}
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(n):
        state[n] = 1
        stack.append(n)
        for m in graph.get(n, ()):
            if state.get(m) == 1:
                return stack[stack.index(m):] + [m]
            if m not in state:
                c = visit(m)
                if c:
                    return c
        state[n] = 2
        stack.pop()
        return None

    for n in sorted(graph):
        if n not in state:
            c = visit(n)
            if c:
                return c
    return None


def problems(root: Path, package: str, allowed=ALLOWED) -> list[str]:
    edges = [e for e in imports(root, package) if not _allowed(e[0], e[1], allowed)]
    out = []
    mods = module_names(root, package)
    medges = {(a, b) for a, b, _ in edges}
    while (cyc := find_cycle(mods, medges)) is not None:        # each cycle once
        out.append("module import cycle: " + " -> ".join(cyc))
        medges.discard((cyc[-2], cyc[-1]))
    parts = {part(m, package) for m in mods}
    pedges = {(part(a, package), part(b, package)) for a, b, _ in edges}
    cyc = find_cycle(parts, [(a, b) for a, b in pedges if a != b])
    if cyc:
        where = [f"{a} ({package}/{mods[a].relative_to(root / package)}:{ln}) imports {b}"
                 for a, b, ln in edges if (part(a, package), part(b, package)) in zip(cyc, cyc[1:])]
        out.append("package import cycle: " + " -> ".join(cyc) + "; " + "; ".join(where))
    for a, b, ln in edges:
        pa, pb = part(a, package), part(b, package)
        if pa in CORE and pa != pb and (pb not in CORE or CORE.index(pb) > CORE.index(pa)):
            out.append(f"{a} (line {ln}) imports {b}: {pa} may import only {CORE[:CORE.index(pa) + 1]}")
    return out


# ----------------------------------------------------------------------------- the checker itself

def _write(root: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        f = root / rel
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text(text)


CLEAN = {
    "pkg/__init__.py": "from .compiler import compile\n",
    "pkg/errors.py": "",
    "pkg/kernels/__init__.py": "",
    "pkg/kernels/conv.py": "from ..errors import *\nfrom . import pool\n",
    "pkg/kernels/pool.py": "",
    "pkg/ir/__init__.py": "from .ops import OPS\n",
    "pkg/ir/ops.py": "from ..kernels import conv\n",
    "pkg/compiler/__init__.py": "from .compile import compile\n",
    "pkg/compiler/compile.py": "from ..ir import OPS\nimport pkg.kernels.pool\n",
    "pkg/stream/__init__.py": "from ..compiler.compile import compile\n",
}


def test_checker_accepts_a_clean_tree(tmp_path):
    _write(tmp_path, CLEAN)
    assert ("pkg.compiler.compile", "pkg.kernels.pool", 2) in imports(tmp_path, "pkg")
    assert problems(tmp_path, "pkg", allowed={}) == []


@pytest.mark.parametrize("rel,text,found", [
    # a kernel importing the IR, lazily: an upward import
    ("pkg/kernels/pool.py", "def f():\n    from ..ir import ops\n", "pkg.kernels.pool (line 2) imports pkg.ir.ops"),
    # ir importing the compiler
    ("pkg/ir/ops.py", "from pkg.compiler import compile\n", "pkg.ir.ops (line 1) imports pkg.compiler"),
    # two modules importing each other (one of them lazily)
    ("pkg/kernels/pool.py", "def f():\n    from . import conv\n", "module import cycle"),
    # compiler -> stream -> compiler at the package level
    ("pkg/compiler/compile.py", "def f():\n    from ..stream import x\n", "package import cycle: compiler -> stream"),
])
def test_checker_finds_cycles_and_upward_imports(tmp_path, rel, text, found):
    _write(tmp_path, CLEAN)
    _write(tmp_path, {rel: text})
    assert any(found in p for p in problems(tmp_path, "pkg", allowed={})), problems(tmp_path, "pkg", {})


def test_checker_allows_a_listed_exception(tmp_path):
    _write(tmp_path, CLEAN)
    _write(tmp_path, {"pkg/compiler/compile.py": "def f():\n    from ..stream import x\n"})
    assert problems(tmp_path, "pkg", allowed={("pkg.compiler.compile", "pkg.stream"): "why"}) == []


# ----------------------------------------------------------------------------- tilefuse

def test_tilefuse_has_no_import_cycle_and_no_upward_import():
    found = problems(ROOT, "tilefuse")
    assert not found, "\n".join(found)


def test_allowed_exceptions_are_still_needed():
    """An exception that no import uses any more is removed from ALLOWED."""
    edges = imports(ROOT, "tilefuse")
    for a, b in ALLOWED:
        assert any(src == a and (dst == b or dst.startswith(b + ".")) for src, dst, _ in edges), (a, b)


# ----------------------------------------------------------------------------- op groups

def test_op_groups():
    from tilefuse.ir import ops
    family = {g: ops.ops_in(g) for g in ops.GROUP_NAMES}
    # every op in exactly one family, named by its schema's group field
    assert sorted(n for s in family.values() for n in s) == sorted(ops.OPS)
    for name, s in ops.OPS.items():
        assert name in family[s.group]
    assert ops.CONV == family["conv"] and ops.POOL == family["pool"] and ops.GLOBAL == family["global"]
    assert ops.ELEMENTWISE == family["elementwise"] and ops.NORM == family["norm"]
    # property groups name real ops of the families they describe
    assert ops.WINDOW <= ops.CONV | ops.POOL
    assert ops.ROW_MAPPED <= ops.CONV | ops.POOL | ops.SHAPE | ops.RESIZE
    assert ops.ROW_LOCAL <= ops.ELEMENTWISE | ops.NORM | ops.SHAPE
    assert ops.MEMORY_BOUND <= ops.ELEMENTWISE | ops.NORM
    for name in ops.ACT_EPILOGUE:                        # each carries a fused relu / act
        assert "relu" in ops.OPS[name].normalize(name, {"has_bias": False}), name
        assert ops.OPS[name].normalize(name, {"has_bias": False, "act": "silu"})["act"][0] == "silu", name
    with pytest.raises(ValueError, match="unknown op group"):
        ops.ops_in("convolution")


def test_streaming_and_passes_match_on_the_groups():
    from tilefuse.compiler import bands, passes
    from tilefuse.ir import ops
    assert bands.STREAMABLE == ops.WINDOW | ops.ROW_LOCAL | ops.ROW_MAPPED
    from tilefuse.kernels import bands as kernel_bands
    assert ops.ROW_MAPPED == kernel_bands.ROW_MAPPED     # every row-mapped op has its row table and runner
    assert "ops.ACT_EPILOGUE" in Path(passes.__file__).read_text()


def _njit_options(node: ast.FunctionDef) -> dict | None:
    """The keyword options of a function's @njit decorator (None: not an njit function)."""
    for d in node.decorator_list:
        fn = d.func if isinstance(d, ast.Call) else d
        name = fn.attr if isinstance(fn, ast.Attribute) else getattr(fn, "id", None)
        if name == "njit":
            return {k.arg: k.value for k in (d.keywords if isinstance(d, ast.Call) else [])}
    return None


def inherited_fastmath(root: Path, package: str) -> list[tuple[str, str, str]]:
    """(file, callee, caller) for every njit function without a stated `fastmath` that a fastmath njit function
    calls (directly or through inline="always" helpers, which compile inside their caller). numba compiles such a
    callee with the flags of whichever caller triggers its first compile and caches that code, so its bits depend
    on the order the process (or the cache's first process) ran the kernels. Functions are matched by name."""
    defs: dict = {}
    for f in sorted((root / package).rglob("*.py")):
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, ast.FunctionDef) and (opts := _njit_options(node)) is not None:
                fm = opts.get("fastmath")
                inline = isinstance(opts.get("inline"), ast.Constant) and opts["inline"].value == "always"
                called = {c.func.attr if isinstance(c.func, ast.Attribute) else getattr(c.func, "id", None)
                          for c in ast.walk(node) if isinstance(c, ast.Call)}
                defs.setdefault(node.name, []).append(
                    (str(f.relative_to(root)), fm is not None, inline,
                     fm is not None and not (isinstance(fm, ast.Constant) and fm.value is False), called))
    found = set()
    for name, entries in defs.items():
        for _, _, inline, fast, called in entries:
            if not fast or inline:
                continue
            todo, seen = list(called), set()
            while todo:
                c = todo.pop()
                if c in seen:
                    continue
                seen.add(c)
                for cf, stated, cinline, _, ccalled in defs.get(c, []):
                    if cinline:
                        todo.extend(ccalled)
                    elif not stated:
                        found.add((cf, c, name))
    return sorted(found)


def test_inherited_fastmath_checker_finds_a_callee_without_flags(tmp_path):
    pkg = tmp_path / "p"
    pkg.mkdir()
    (pkg / "m.py").write_text(
        "from numba import njit\n"
        "@njit(cache=True)\ndef plain(x):\n    return x * 2.0\n"
        "@njit(inline='always')\ndef helper(x):\n    return plain(x)\n"
        "@njit(fastmath=False)\ndef stated(x):\n    return x + 1.0\n"
        "@njit(fastmath=True)\ndef fast(x):\n    return helper(x) + stated(x)\n")
    assert inherited_fastmath(tmp_path, "p") == [("p/m.py", "plain", "fast")]


def test_no_kernel_inherits_fastmath_from_its_caller():
    """Every njit function a fastmath kernel calls states its own flags (activations.apply_span: its SiLU bits
    had depended on whether epilogue.act_span or a plain kernel compiled it first)."""
    assert inherited_fastmath(ROOT, "tilefuse") == []


def test_no_kernel_assumes_finite_values():
    """numba's `fastmath=True` includes `nnan` and `ninf`: LLVM may then drop a NaN or raise numba's
    division-by-zero error on one (the tanh activation returned -1 for NaN, the channel norm raised; see
    tests/test_nonfinite.py). Kernels state `fpflags.FAST` or a narrower set, never the two flags."""
    found = []
    for f in sorted((ROOT / "tilefuse").rglob("*.py")):
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, ast.keyword) and node.arg == "fastmath":
                v = node.value
                named = {e.value for e in getattr(v, "elts", []) if isinstance(e, ast.Constant)}
                flags = {"nnan", "ninf"} if isinstance(v, ast.Constant) and v.value is True else named & {
                    "nnan", "ninf", "fast"}
                if flags:
                    found.append(f"{f.relative_to(ROOT)}:{node.lineno}")
    from tilefuse.kernels.fpflags import FAST
    assert not found and not FAST & {"nnan", "ninf", "fast"}, found
