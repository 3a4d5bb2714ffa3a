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
  and nothing after it. Loading checks every one of these and every offset; any problem
  raises PackageError. Nothing is ever unpickled.
"""
from __future__ import annotations

import hashlib
import json
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

MAGIC = b"TFPKG\r\n\x1a"
FORMAT_VERSION = 1
MAX_HEADER = 64 << 20


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
    const_area: bytes
    blocks: list[Block]
    io: list[IOSlot]
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def inputs(self) -> list[IOSlot]:
        return [s for s in self.io if s.kind == "input"]

    @property
    def outputs(self) -> list[IOSlot]:
        return [s for s in self.io if s.kind == "output"]

    def program(self):
        return decode(self.const_area[:self.program_size])

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
    area = bytearray(const_total)
    area[:len(program)] = program
    blocks = []
    for d in low.constants:
        off = offsets[(CONST, d.name)]
        raw = np.ascontiguousarray(d.value).tobytes()
        area[off:off + len(raw)] = raw
        blocks.append(Block(d.name, "const", off, len(raw), d.dtype.str, tuple(d.shape)))
    hidden_shapes = {op.name: op for ins in low.instructions for op in ins.operands if op.segment == HIDDEN}
    for nm, off in sorted(mem.offsets.items(), key=lambda kv: kv[1]):
        o = hidden_shapes[nm]
        blocks.append(Block(nm, "hidden", off, o.nbytes, o.dtype.str, o.shape))
    io = [IOSlot(nm, kind, offsets[(IO, nm)], np.dtype(dt).str, tuple(shape))
          for nm, kind, dt, shape in low.io]
    m = dict(meta or {})
    m.setdefault("hidden_naive_bytes", mem.naive_bytes)
    return DataPackage(name, const_total, mem.planned_bytes, io_total, len(program), bytes(area),
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
    """Read and fully validate a .tfpkg file; any problem raises PackageError."""
    try:
        data = Path(path).read_bytes()
    except OSError as e:
        raise PackageError(f"cannot read package file {path}: {e}") from e
    return from_bytes(data, str(path))


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


def _from_bytes(data: bytes, where: str) -> DataPackage:
    if len(data) < 20:
        raise PackageError(f"{where}: file is {len(data)} bytes, too short for a package header (20)")
    if data[:8] != MAGIC:
        raise PackageError(f"{where}: bad magic {data[:8]!r}; expected {MAGIC!r} (not a tilefuse package)")
    version, hlen = struct.unpack_from("<II", data, 8)
    if version != FORMAT_VERSION:
        raise PackageError(f"{where}: format version {version} is not supported; expected {FORMAT_VERSION}")
    if hlen > MAX_HEADER or 16 + hlen + 4 > len(data):
        raise PackageError(f"{where}: header length {hlen} exceeds the file ({len(data)} bytes): truncated?")
    head = data[16:16 + hlen]
    (crc,) = struct.unpack_from("<I", data, 16 + hlen)
    if zlib.crc32(head) != crc:
        raise PackageError(f"{where}: header checksum mismatch (stored {crc:#010x}, "
                           f"computed {zlib.crc32(head):#010x}): the file was altered")
    try:
        h = json.loads(head.decode())
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise PackageError(f"{where}: header is not valid JSON: {e}") from e
    if not isinstance(h, dict) or h.get("format") != "tilefuse-package":
        raise PackageError(f"{where}: header does not describe a tilefuse package")
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
    area = data[start:]
    if hashlib.sha256(area).hexdigest() != _req(h, "const_sha256", str, where):
        raise PackageError(f"{where}: constant area checksum (SHA-256) mismatch: the file was altered")
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
    validate_program(pkg, where)
    return pkg


def validate_program(pkg: DataPackage, where: str = "package") -> None:
    """Every operand must lie inside its segment and IO operands must match their slot."""
    from ..kernels.registry import KERNELS
    sizes = {CONST: pkg.const_bytes, HIDDEN: pkg.hidden_bytes}
    slots = {s.offset: s for s in pkg.io}
    for i, ins in enumerate(pkg.program()):
        if ins.kernel not in KERNELS:
            raise PackageError(f"{where}: instruction {i} uses unknown kernel '{ins.kernel}'")
        for op in ins.operands:
            w = f"{where}: instruction {i} ({ins.kernel}) operand '{op.name}'"
            if op.segment == IO:
                s = slots.get(op.seg_offset)
                if s is None:
                    raise PackageError(f"{w}: IO slot offset {op.seg_offset} is not a slot")
                if op.block_offset + op.nbytes > int(np.prod(s.shape)) * np.dtype(s.dtype).itemsize:
                    raise PackageError(f"{w}: reads past the end of IO block '{s.name}'")
            else:
                end = op.seg_offset + op.block_offset + op.nbytes
                lo = pkg.program_size if op.segment == CONST else 0
                if op.seg_offset < lo or end > sizes[op.segment]:
                    raise PackageError(f"{w}: [{op.seg_offset}, {end}) lies outside the "
                                       f"{SEGMENTS[op.segment]} segment ({sizes[op.segment]} bytes)")
