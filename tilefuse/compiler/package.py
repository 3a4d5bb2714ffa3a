"""The data package: tags + constant area, built by REOFF, saved as a self-describing file.

REOFF (seed 002, section 3.2.3):
  1. REorder: the constant area holds the instructions first, then the bound constants; block
     sizes are recorded, and the three tags: constant bytes, hidden bytes, IO-address bytes
     (8 bytes per network input and output).
  2. OFFset: each block's offset inside its own segment (constants: running sum, aligned to
     64 bytes; hidden: the liveness plan, so intermediates share memory; IO: slot i at 8*i).
  3. Fill: the offsets are written back into the instruction fields the encoder recorded.

File format (.tfpkg), little endian:
  offset 0   8 bytes  magic b"TFPKG\\r\\n\\x1a" (the CR LF and ^Z catch text-mode mangling)
  offset 8   u32      format version (1)
  offset 12  u32      header length H
  offset 16  H bytes  header: JSON object, utf-8 (see `_HEADER_KEYS`): name, tags, program
                      size, blocks (name, segment, offset, nbytes, dtype, shape), io slots,
                      const-area SHA-256, metadata
  16+H       u32      CRC-32 of the header bytes
  then zero padding up to a multiple of 64 bytes, then the constant area (tags.const_bytes),
  and nothing after it. Nothing is ever unpickled.

A package file is untrusted input. `load_package` reads the 16-byte prefix first (magic,
version, header length bounded by MAX_HEADER and by the file size), then the header, checks the
sizes it declares against the file size, and only then reads the body. `validate_package` then
checks every block and IO slot against its segment (the input slots before the output slots),
decodes the program and checks every
instruction (`validate_program`): each operand lies inside the block it names with the block's
dtype, outputs never write constants or inputs nor overlap their own inputs, every hidden or
output byte an instruction reads was written before, every output is written completely, and
the kernel's validator (compiler/validate.py) re-derives the operand shapes from the parameters
with the IR's shape inference. Any problem raises PackageError.

The CRC-32 and SHA-256 catch accidents (truncated downloads, flipped bits, text-mode
mangling); they are not a signature: anyone can recompute them, so they prove nothing about
who made the file. The validation above is what keeps a crafted package from running.
"""
from __future__ import annotations

import hashlib
import json
import os
import stat
import struct
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import PackageError
from .lower import Lowered
from .memory import ALIGN, MemoryPlan, align
from .program import CONST, HIDDEN, IO, IO_SLOT_BYTES, SEGMENTS, decode, encode, patch
from .streaming import REGION_HEADERS, REGION_KERNELS, validate_stream

MAGIC = b"TFPKG\r\n\x1a"
FORMAT_VERSION = 1
MAX_HEADER = 64 << 20


AREA_ALIGN = 64   # host address alignment of a constant area (a cache line)


def aligned_area(nbytes: int) -> memoryview:
    """A writable, zeroed byte buffer of nbytes whose first byte is on a 64-byte boundary (a memoryview of
    bytes, used as a bytearray is: len, slicing, hashing, concatenation, numpy.frombuffer). The constant
    area's blocks are 64-byte aligned offsets, and a zero-copy device maps the area in place, so the
    weights the kernels read are cache-line aligned only if the area is: a bytearray's (malloc's) buffer
    starts 16 bytes past one, which splits every 64-byte weight load of the AVX-512 kernels in two."""
    from ..kernels.threads import aligned_empty
    return memoryview(aligned_empty(int(nbytes), np.uint8, AREA_ALIGN, zeros=True)).cast("B")


@dataclass(frozen=True)
class Block:
    name: str
    segment: str      # 'const' | 'hidden'
    offset: int
    nbytes: int
    dtype: str
    shape: tuple[int, ...]


@dataclass(frozen=True)
class IOSlot:
    name: str
    kind: str         # 'input' | 'output'
    offset: int       # in the IO-address segment
    dtype: str
    shape: tuple[int, ...]


@dataclass
class DataPackage:
    name: str
    const_bytes: int            # tag 1
    hidden_bytes: int           # tag 2
    io_bytes: int               # tag 3
    program_size: int           # the program block sits at offset 0 of the constant area
    const_area: bytes | bytearray | memoryview   # aligned_area() when compiled or loaded: a zero-copy device
                                                 # maps it in place
    blocks: list[Block]
    io: list[IOSlot]
    meta: dict[str, Any] = field(default_factory=dict)
    validated: bool = field(default=False, compare=False, repr=False)   # validate_package passed

    @property
    def inputs(self) -> list[IOSlot]:
        return [s for s in self.io if s.kind == "input"]

    @property
    def outputs(self) -> list[IOSlot]:
        return [s for s in self.io if s.kind == "output"]

    def program(self):
        return decode(self.const_area[:self.program_size])

    def __deepcopy__(self, memo):
        """A copy whose constant area is a new aligned_area (a memoryview cannot be deep-copied itself)."""
        import copy
        new = object.__new__(type(self))
        memo[id(self)] = new
        for k, v in self.__dict__.items():
            if isinstance(v, memoryview):
                c = aligned_area(v.nbytes)
                c[:] = v
                v = c
            else:
                v = copy.deepcopy(v, memo)
            object.__setattr__(new, k, v)
        return new

    def save(self, path) -> Path:
        return save_package(self, path)


# ----------------------------------------------------------------------------- REOFF

def reoff_pack(name: str, low: Lowered, mem: MemoryPlan, meta: dict | None = None) -> DataPackage:
    # (1) reorder: instructions first, then the bound constants; block sizes and tags
    program, sites = encode(low.instructions)
    const_blocks = [("__program__", len(program))] + [(d.name, d.nbytes) for d in low.constants]
    # (2) offsets inside each segment
    offsets: dict[tuple[int, str], int] = {}
    pos = 0
    for nm, size in const_blocks:
        offsets[(CONST, nm)] = pos
        pos = align(pos + size)
    const_total = pos
    for nm, off in mem.offsets.items():
        offsets[(HIDDEN, nm)] = off
    for i, (nm, _, _, _) in enumerate(low.io):
        offsets[(IO, nm)] = i * IO_SLOT_BYTES
    io_total = IO_SLOT_BYTES * len(low.io)
    # (3) fill the offsets back into the instruction fields recorded by the encoder
    patch(program, sites, offsets)
    area = aligned_area(const_total)
    area[:len(program)] = program
    blocks = []
    for d in low.constants:
        off = offsets[(CONST, d.name)]
        value = np.ascontiguousarray(d.value)
        nbytes = value.nbytes
        # written in place: a bytes copy of each constant (38 MiB for a Winograd-prepared layer4
        # conv of ResNet18) would be one more temporary at the compile's peak
        np.frombuffer(area, np.uint8, nbytes, off)[:] = value.reshape(-1).view(np.uint8)
        blocks.append(Block(d.name, "const", off, nbytes, d.dtype.str, tuple(d.shape)))
    hidden_shapes = {op.name: op for ins in low.instructions for op in ins.operands if op.segment == HIDDEN}
    for nm, off in sorted(mem.offsets.items(), key=lambda kv: kv[1]):
        o = hidden_shapes[nm]
        blocks.append(Block(nm, "hidden", off, o.nbytes, o.dtype.str, o.shape))
    io = [IOSlot(nm, kind, offsets[(IO, nm)], np.dtype(dt).str, tuple(shape))
          for nm, kind, dt, shape in low.io]
    m = dict(meta or {})
    m.setdefault("hidden_naive_bytes", mem.naive_bytes)
    return DataPackage(name, const_total, mem.planned_bytes, io_total, len(program), area,
                       blocks, io, m)


# ----------------------------------------------------------------------------- file I/O

def _header(pkg: DataPackage) -> dict:
    return {
        "format": "tilefuse-package",
        "name": pkg.name,
        "tags": {"const_bytes": pkg.const_bytes, "hidden_bytes": pkg.hidden_bytes, "io_bytes": pkg.io_bytes},
        "program_size": pkg.program_size,
        "const_sha256": hashlib.sha256(pkg.const_area).hexdigest(),
        "blocks": [{"name": b.name, "segment": b.segment, "offset": b.offset, "nbytes": b.nbytes,
                    "dtype": b.dtype, "shape": list(b.shape)} for b in pkg.blocks],
        "io": [{"name": s.name, "kind": s.kind, "offset": s.offset, "dtype": s.dtype, "shape": list(s.shape)}
               for s in pkg.io],
        "meta": pkg.meta,
    }


def to_bytes(pkg: DataPackage) -> bytes:
    head = json.dumps(_header(pkg), sort_keys=True, separators=(",", ":")).encode()
    pre = MAGIC + struct.pack("<II", FORMAT_VERSION, len(head)) + head + struct.pack("<I", zlib.crc32(head))
    pad = b"\0" * (align(len(pre)) - len(pre))
    return pre + pad + pkg.const_area


def save_package(pkg: DataPackage, path) -> Path:
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(to_bytes(pkg))
    tmp.replace(path)
    return path


def load_package(path) -> DataPackage:
    """Read and fully validate a .tfpkg file; any problem raises PackageError.

    The prefix and the header are read and checked before the body, so a file that is not a
    package (or claims impossible sizes) costs a 16-byte read; only regular files are opened."""
    where = str(path)
    try:
        st = os.stat(path)
        if not stat.S_ISREG(st.st_mode):
            raise PackageError(f"{where}: not a regular file (a device, pipe or directory); "
                               f"expected a .tfpkg file")
        size = st.st_size
        with open(path, "rb") as f:
            pre = f.read(16)
            hlen = _check_prefix(pre, size, where)
            head = f.read(hlen + 4)
            if len(head) != hlen + 4:
                raise PackageError(f"{where}: file ended inside the header (changed while reading?)")
            h = _parse_header(head[:hlen], struct.unpack_from("<I", head, hlen)[0], where)
            cb = _req(_req(h, "tags", dict, where), "const_bytes", int, where)
            start = align(16 + hlen + 4)
            if size != start + cb:
                raise PackageError(f"{where}: file is {size} bytes; header says {start + cb} "
                                   f"({start} header + {cb} constant area): "
                                   f"{'truncated' if size < start + cb else 'trailing bytes'}")
            body = f.read(size - 16 - hlen - 4)
    except PackageError:
        raise
    except OSError as e:
        raise PackageError(f"cannot read package file {where}: {e}") from e
    return from_bytes(pre + head + body, where)


def from_bytes(data: bytes, where: str = "<bytes>") -> DataPackage:
    try:
        return _from_bytes(bytes(data), where)
    except PackageError:
        raise
    except Exception as e:  # safety net: a malformed file must never escape as another error
        raise PackageError(f"{where}: malformed package ({type(e).__name__}: {e})") from e


def _req(obj: dict, key: str, typ, where: str):
    if not isinstance(obj, dict) or key not in obj:
        raise PackageError(f"{where}: header field '{key}' is missing")
    v = obj[key]
    if typ is int and (isinstance(v, bool) or not isinstance(v, int)):
        raise PackageError(f"{where}: header field '{key}'={v!r} must be an integer")
    if typ is not int and not isinstance(v, typ):
        raise PackageError(f"{where}: header field '{key}' has type {type(v).__name__}, expected {typ.__name__}")
    if typ is int and v < 0:
        raise PackageError(f"{where}: header field '{key}'={v} must be >= 0")
    return v


def _dtype(s, where: str) -> np.dtype:
    from .program import DTYPES
    try:
        dt = np.dtype(s)
    except TypeError:
        raise PackageError(f"{where}: dtype {s!r} is not a dtype") from None
    if dt not in DTYPES:
        raise PackageError(f"{where}: dtype {dt} is not one tilefuse uses")
    return dt


def _shape(v, where: str) -> tuple[int, ...]:
    if not isinstance(v, list) or not all(isinstance(d, int) and not isinstance(d, bool) and d > 0 for d in v):
        raise PackageError(f"{where}: shape {v!r} must be a list of positive integers")
    return tuple(v)


def _check_prefix(pre: bytes, size: int, where: str) -> int:
    """Magic, version and header length of the first 16 bytes; returns the header length."""
    if size < 20 or len(pre) < 16:
        raise PackageError(f"{where}: file is {size} bytes, too short for a package header (20)")
    if pre[:8] != MAGIC:
        raise PackageError(f"{where}: bad magic {pre[:8]!r}; expected {MAGIC!r} (not a tilefuse package)")
    version, hlen = struct.unpack_from("<II", pre, 8)
    if version != FORMAT_VERSION:
        raise PackageError(f"{where}: format version {version} is not supported; expected {FORMAT_VERSION}")
    if hlen > MAX_HEADER or 16 + hlen + 4 > size:
        raise PackageError(f"{where}: header length {hlen} exceeds the file ({size} bytes) or the "
                           f"{MAX_HEADER}-byte limit: truncated or not a package?")
    return hlen


def _parse_header(head: bytes, crc: int, where: str) -> dict:
    if zlib.crc32(head) != crc:
        raise PackageError(f"{where}: header checksum mismatch (stored {crc:#010x}, "
                           f"computed {zlib.crc32(head):#010x}): the file was damaged")
    try:
        h = json.loads(head.decode())
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as e:
        raise PackageError(f"{where}: header is not valid JSON: {e}") from e
    if not isinstance(h, dict) or h.get("format") != "tilefuse-package":
        raise PackageError(f"{where}: header does not describe a tilefuse package")
    return h


def _from_bytes(data: bytes, where: str) -> DataPackage:
    hlen = _check_prefix(data[:16], len(data), where)
    (crc,) = struct.unpack_from("<I", data, 16 + hlen)
    h = _parse_header(data[16:16 + hlen], crc, where)
    name = _req(h, "name", str, where)
    tags = _req(h, "tags", dict, where)
    cb, hb, ib = (_req(tags, k, int, where) for k in ("const_bytes", "hidden_bytes", "io_bytes"))
    psize = _req(h, "program_size", int, where)
    start = align(16 + hlen + 4)
    if len(data) != start + cb:
        raise PackageError(f"{where}: file is {len(data)} bytes; header says {start + cb} "
                           f"({start} header + {cb} constant area): "
                           f"{'truncated' if len(data) < start + cb else 'trailing bytes'}")
    if any(data[16 + hlen + 4:start]):
        raise PackageError(f"{where}: padding after the header is not zero")
    area = aligned_area(cb)   # writable and cache-line aligned: a zero-copy device maps it (runtime/device.py)
    area[:] = memoryview(data)[start:]
    if hashlib.sha256(area).hexdigest() != _req(h, "const_sha256", str, where):
        raise PackageError(f"{where}: constant area checksum (SHA-256) mismatch: the file was damaged")
    if psize > cb:
        raise PackageError(f"{where}: program size {psize} exceeds the constant area {cb}")
    if ib % 8:
        raise PackageError(f"{where}: IO address area {ib} bytes is not a multiple of 8")
    seg_size = {"const": cb, "hidden": hb}
    blocks = []
    for i, b in enumerate(_req(h, "blocks", list, where)):
        w = f"{where}: block {i}"
        seg = _req(b, "segment", str, w)
        if seg not in seg_size:
            raise PackageError(f"{w}: segment '{seg}', expected const or hidden")
        off, nb = _req(b, "offset", int, w), _req(b, "nbytes", int, w)
        dt, shape = _dtype(_req(b, "dtype", str, w), w), _shape(_req(b, "shape", list, w), w)
        if int(np.prod(shape, dtype=object)) * dt.itemsize != nb:
            raise PackageError(f"{w}: shape {shape} of {dt} is not {nb} bytes")
        if off + nb > seg_size[seg] or (seg == "const" and off < psize):
            raise PackageError(f"{w} ('{b.get('name')}'): [{off}, {off + nb}) lies outside its "
                               f"{seg} segment ({seg_size[seg]} bytes)")
        blocks.append(Block(_req(b, "name", str, w), seg, off, nb, dt.str, shape))
    io = []
    for i, s in enumerate(_req(h, "io", list, where)):
        w = f"{where}: io slot {i}"
        kind = _req(s, "kind", str, w)
        off = _req(s, "offset", int, w)
        if kind not in ("input", "output") or off != 8 * i or off + 8 > ib:
            raise PackageError(f"{w}: kind '{kind}' offset {off}; expected input/output at {8 * i} < {ib}")
        io.append(IOSlot(_req(s, "name", str, w), kind, off,
                         _dtype(_req(s, "dtype", str, w), w).str, _shape(_req(s, "shape", list, w), w)))
    if 8 * len(io) != ib:
        raise PackageError(f"{where}: {len(io)} io slots need {8 * len(io)} bytes, tag says {ib}")
    pkg = DataPackage(name, cb, hb, ib, psize, area, blocks, io, _req(h, "meta", dict, where))
    validate_package(pkg, where)
    return pkg


class _Written:
    """Which block last wrote each byte range of one segment (or IO slot): sorted, disjoint
    (start, end, name) spans. A read of block N must find every byte last written as N."""

    def __init__(self):
        self.spans: list[tuple[int, int, str]] = []

    def add(self, a: int, b: int, name: str) -> None:
        out = []
        for s0, s1, n in self.spans:
            if s1 <= a or s0 >= b:
                out.append((s0, s1, n))
                continue
            if s0 < a:
                out.append((s0, a, n))
            if s1 > b:
                out.append((b, s1, n))
        out.append((a, b, name))
        self.spans = sorted(out)

    def covers(self, a: int, b: int, name: str) -> bool:
        if a >= b:
            return True
        pos = a
        for s0, s1, n in self.spans:
            if s1 <= pos or s0 >= b:
                continue
            if s0 > pos or n != name:
                return False
            pos = s1
        return pos >= b


def validate_package(pkg: DataPackage, where: str = "package") -> None:
    """Blocks and IO slots against the tags, then the program (`validate_program`); marks the
    package validated. Any problem raises PackageError."""
    try:
        _validate_package(pkg, where)
    except PackageError:
        raise
    except Exception as e:  # a malformed package must never escape as another error
        raise PackageError(f"{where}: malformed package ({type(e).__name__}: {e})") from e
    pkg.validated = True


def _validate_package(pkg: DataPackage, where: str) -> None:
    if len(pkg.const_area) != pkg.const_bytes or pkg.program_size > pkg.const_bytes:
        raise PackageError(f"{where}: constant area is {len(pkg.const_area)} bytes, tag says "
                           f"{pkg.const_bytes}, program {pkg.program_size}")
    seen = set()
    const_spans = [(0, pkg.program_size, "__program__")]
    hidden_end = 0
    for b in pkg.blocks:
        if (b.segment, b.name) in seen:
            raise PackageError(f"{where}: block '{b.name}' appears twice in the {b.segment} segment")
        seen.add((b.segment, b.name))
        if b.segment == "const":
            const_spans.append((b.offset, b.offset + b.nbytes, b.name))
        else:
            hidden_end = max(hidden_end, b.offset + b.nbytes)
    const_spans.sort()
    for (a0, a1, an), (b0, b1, bn) in zip(const_spans, const_spans[1:]):
        if b0 < a1:
            raise PackageError(f"{where}: constant blocks '{an}' [{a0}, {a1}) and '{bn}' [{b0}, {b1}) overlap")
    if pkg.hidden_bytes > align(hidden_end):
        raise PackageError(f"{where}: hidden segment of {pkg.hidden_bytes} bytes, but its blocks end at "
                           f"{hidden_end}; expected at most {align(hidden_end)}")
    names = [s.name for s in pkg.io]
    if len(set(names)) != len(names):
        raise PackageError(f"{where}: IO slot names {names} repeat; expected distinct names")
    if not pkg.outputs:
        raise PackageError(f"{where}: the package has no outputs")
    kinds = [s.kind for s in pkg.io]
    if "output" in kinds and "input" in kinds[kinds.index("output"):]:
        i = kinds.index("input", kinds.index("output"))
        raise PackageError(f"{where}: io slot {i} (input '{pkg.io[i].name}') follows an output; expected the "
                           f"inputs first, then the outputs (a run passes their addresses in that order)")
    # {input name: integer dtype}: a run converts such arrays (ir/node.py check_inputs); {output name: integer
    # dtype}: a run checks and converts such outputs (ir/node.py integer_results)
    for key, kind, slots in (("integer_inputs", "input", pkg.inputs), ("integer_outputs", "output", pkg.outputs)):
        ints = pkg.meta.get(key)
        if ints is None:
            continue
        floats = {s.name for s in slots if np.dtype(s.dtype).kind == "f"}
        if not isinstance(ints, dict) or not all(isinstance(k, str) and k in floats and isinstance(v, str)
                                                 for k, v in ints.items()):
            raise PackageError(f"{where}: meta {key} {ints!r}; expected {{{kind} name: integer dtype}} "
                               f"naming float {kind}s among {sorted(floats)}")
        for k, v in ints.items():
            try:
                ok = np.dtype(v).kind in "iu"
            except TypeError:
                ok = False
            if not ok:
                raise PackageError(f"{where}: meta {key} gives {kind} '{k}' the dtype {v!r}; expected an "
                                   f"integer dtype")
    validate_program(pkg, where)


def validate_program(pkg: DataPackage, where: str = "package") -> None:
    """Every instruction: a kernel with a validator; every operand inside the block it names, with
    its dtype and an aligned offset; outputs into hidden blocks or output slots only, never over
    their own inputs; a hidden or output block read only where an earlier instruction wrote it as
    that block and nothing overwrote it since (so shared hidden memory respects the lifetimes);
    every output written completely; the kernel's validator (re-derived shapes, bounded
    parameters)."""
    from ..kernels.registry import KERNELS
    from .validate import VALIDATORS, check_shapes
    blocks = {(CONST if b.segment == "const" else HIDDEN, b.name): b for b in pkg.blocks}
    slots = {s.offset: s for s in pkg.io}
    written = {HIDDEN: _Written()}
    written.update({("io", s.name): _Written() for s in pkg.outputs})
    program = pkg.program()
    for i, ins in enumerate(program):
        w = f"{where}: instruction {i} ({ins.kernel} -> '{ins.output.name}')"
        if ins.kernel not in KERNELS:
            raise PackageError(f"{where}: instruction {i} uses unknown kernel '{ins.kernel}'; "
                               f"known: {', '.join(sorted(KERNELS))}")
        validator = VALIDATORS.get(ins.kernel)
        if validator is None:
            raise PackageError(f"{w}: kernel '{ins.kernel}' has no validator (compiler/validate.py VALIDATORS), "
                               f"so no package may use it")
        spans = []    # (key, start, end, operand) per operand
        for op in ins.operands:
            ow = f"{w} operand '{op.name}'"
            item = op.dtype.itemsize
            if op.block_offset % item:
                raise PackageError(f"{ow}: block offset {op.block_offset} is not a multiple of its "
                                   f"{op.dtype} item size {item}")
            if op.segment == IO:
                s = slots.get(op.seg_offset)
                if s is None:
                    raise PackageError(f"{ow}: IO slot offset {op.seg_offset} is not a slot")
                size = int(np.prod(s.shape)) * np.dtype(s.dtype).itemsize
                if s.name != op.name or np.dtype(s.dtype) != op.dtype:
                    raise PackageError(f"{ow} ({op.dtype}): IO slot +{op.seg_offset} is '{s.name}' "
                                       f"({np.dtype(s.dtype)}); expected the same name and dtype")
                if op.block_offset + op.nbytes > size:
                    raise PackageError(f"{ow}: [{op.block_offset}, {op.block_offset + op.nbytes}) reaches past "
                                       f"the end of IO block '{s.name}' ({size} bytes)")
                key = ("io", s.name)
                spans.append((key, op.block_offset, op.block_offset + op.nbytes, op, s.kind))
            else:
                b = blocks.get((op.segment, op.name))
                seg = SEGMENTS[op.segment]
                if b is None:
                    raise PackageError(f"{ow}: no {seg} block named '{op.name}'")
                if op.seg_offset != b.offset or np.dtype(b.dtype) != op.dtype:
                    raise PackageError(f"{ow}: at {seg} offset {op.seg_offset} as {op.dtype}; block "
                                       f"'{b.name}' is at {b.offset} as {np.dtype(b.dtype)}")
                if op.block_offset + op.nbytes > b.nbytes:
                    raise PackageError(f"{ow}: [{op.block_offset}, {op.block_offset + op.nbytes}) reaches "
                                       f"past the end of its block ({b.nbytes} bytes)")
                start = b.offset + op.block_offset
                spans.append((op.segment, start, start + op.nbytes, op, None))
        if ins.kernel in REGION_HEADERS:     # a stream header: it reads its constants, writes nothing
            try:
                check_shapes(ins)
                validator(ins)
            except ValueError as e:
                raise PackageError(f"{w}: {e}") from None
            continue
        *reads, (okey, o0, o1, out, okind) = spans
        if okey == CONST:
            raise PackageError(f"{w}: writes into the constant segment; expected a hidden block or an output")
        if okind == "input":
            raise PackageError(f"{w}: writes into network input '{out.name}'; expected a hidden block or an output")
        for key, a, b, op, kind in reads:
            if key == okey and a < o1 and o0 < b:
                raise PackageError(f"{w}: output [{o0}, {o1}) overlaps input '{op.name}' [{a}, {b}) "
                                   f"in the same segment; expected disjoint memory")
            if key in written and not written[key].covers(a, b, op.name):
                raise PackageError(f"{w}: reads '{op.name}' bytes [{a}, {b}) that no earlier instruction "
                                   f"wrote as '{op.name}' (never written, or overwritten since)")
        try:
            check_shapes(ins)
            validator(ins)
        except ValueError as e:
            raise PackageError(f"{w}: {e}") from None
        written[okey].add(o0, o1, out.name)
    for s in pkg.outputs:
        size = int(np.prod(s.shape)) * np.dtype(s.dtype).itemsize
        if not written[("io", s.name)].covers(0, size, s.name):
            raise PackageError(f"{where}: output '{s.name}' ({size} bytes) is not written completely by the program")
    if any(ins.kernel in REGION_KERNELS for ins in program):
        def read_const(op):
            return np.frombuffer(pkg.const_area, op.dtype, int(np.prod(op.shape)),
                                 op.seg_offset + op.block_offset).reshape(op.shape)
        validate_stream(program, read_const, where)    # regions: the steps replayed against the rings
