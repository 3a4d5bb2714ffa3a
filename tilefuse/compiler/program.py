"""Program: a list of instructions, each a kernel plus operand addresses, and its binary form.

An operand is addressed as QingLong does (section 3.2.2 of seed 002):
  DIRECT   (constants, hidden data): address = segment base + segment offset + block offset
  INDIRECT (network inputs/outputs):  pointer = *(segment base + segment offset);
                                      address = pointer + block offset
The segment offset is not known when the instruction is emitted: the encoder leaves a fixed
8-byte field and records its byte position (a patch site) so the packer can fill it in
(REOFF step 3) without re-encoding.

Binary layout of the program block (little endian), all sizes in bytes:
  b"TFPG"  u32 version  u32 n_instructions
  per instruction:
    u16 len + kernel name (utf-8)   u32 len + params (JSON object, utf-8)   u16 n_operands
    per operand:
      u16 len + data node name (utf-8)
      u8 mode (0 direct, 1 indirect)  u8 segment (0 const, 1 hidden, 2 io)
      u8 dtype code (see DTYPES)      u8 ndim
      u64 segment offset (patched)    u64 block offset   u64 nbytes   ndim x u64 dims
Operands are the instruction's inputs in order, then its output (the last operand).
"""
from __future__ import annotations

import json
import struct
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..errors import PackageError

DIRECT, INDIRECT = 0, 1
CONST, HIDDEN, IO = 0, 1, 2
SEGMENTS = ("const", "hidden", "io")
DTYPES = (np.dtype(np.float32), np.dtype(np.float64), np.dtype(np.float16), np.dtype(np.uint8),
          np.dtype(np.int32), np.dtype(np.int64))
PROGRAM_MAGIC = b"TFPG"
PROGRAM_VERSION = 1
IO_SLOT_BYTES = 8


@dataclass
class Operand:
    name: str
    mode: int
    segment: int
    dtype: np.dtype
    shape: tuple[int, ...]
    seg_offset: int = 0
    block_offset: int = 0

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape)) * self.dtype.itemsize


@dataclass
class Instruction:
    kernel: str
    operands: list[Operand]
    params: dict[str, Any] = field(default_factory=dict)

    @property
    def output(self) -> Operand:
        return self.operands[-1]

    @property
    def inputs(self) -> list[Operand]:
        return self.operands[:-1]


def _jsonable(v):
    if isinstance(v, (tuple, list)):
        return [_jsonable(x) for x in v]
    if isinstance(v, dict):
        return {str(k): _jsonable(x) for k, x in v.items()}
    if isinstance(v, (np.integer,)):
        return int(v)
    if isinstance(v, (np.floating,)):
        return float(v)
    if isinstance(v, (np.bool_,)):
        return bool(v)
    return v


def _untuple(v):
    """JSON lists back to tuples, so decoded params equal the compiler's."""
    if isinstance(v, list):
        return tuple(_untuple(x) for x in v)
    if isinstance(v, dict):
        return {k: _untuple(x) for k, x in v.items()}
    return v


def encode(instructions: list[Instruction]) -> tuple[bytearray, list[tuple[int, str, int]]]:
    """Encode the program; return (bytes, patch sites as (byte position, node name, segment))."""
    out = bytearray(PROGRAM_MAGIC + struct.pack("<II", PROGRAM_VERSION, len(instructions)))
    sites: list[tuple[int, str, int]] = []
    for ins in instructions:
        k = ins.kernel.encode()
        p = json.dumps(_jsonable(ins.params), sort_keys=True, separators=(",", ":")).encode()
        out += struct.pack("<H", len(k)) + k + struct.pack("<I", len(p)) + p
        out += struct.pack("<H", len(ins.operands))
        for op in ins.operands:
            nm = op.name.encode()
            out += struct.pack("<H", len(nm)) + nm
            out += struct.pack("<BBBB", op.mode, op.segment, DTYPES.index(op.dtype), len(op.shape))
            sites.append((len(out), op.name, op.segment))
            out += struct.pack("<QQQ", op.seg_offset, op.block_offset, op.nbytes)
            out += struct.pack(f"<{len(op.shape)}Q", *op.shape)
    return out, sites


def patch(program: bytearray, sites, offsets: dict[tuple[int, str], int]) -> None:
    """REOFF step 3: write each node's segment offset into the recorded positions."""
    for pos, name, seg in sites:
        struct.pack_into("<Q", program, pos, offsets[(seg, name)])


class _Reader:
    def __init__(self, buf: bytes):
        self.buf = memoryview(buf)
        self.pos = 0

    def take(self, n: int, what: str) -> memoryview:
        if n < 0 or self.pos + n > len(self.buf):
            raise PackageError(f"program block truncated while reading {what} at byte {self.pos} "
                               f"(needs {n} bytes, {len(self.buf) - self.pos} left)")
        v = self.buf[self.pos:self.pos + n]
        self.pos += n
        return v

    def unpack(self, fmt: str, what: str):
        return struct.unpack(fmt, self.take(struct.calcsize(fmt), what))

    def text(self, lenfmt: str, what: str) -> str:
        (n,) = self.unpack(lenfmt, what + " length")
        try:
            return bytes(self.take(n, what)).decode()
        except UnicodeDecodeError as e:
            raise PackageError(f"program block: {what} at byte {self.pos - n} is not utf-8") from e


def decode(buf: bytes) -> list[Instruction]:
    """Decode a program block, checking every length; raises PackageError."""
    r = _Reader(buf)
    if bytes(r.take(4, "magic")) != PROGRAM_MAGIC:
        raise PackageError(f"program block does not start with {PROGRAM_MAGIC!r}")
    version, n = r.unpack("<II", "header")
    if version != PROGRAM_VERSION:
        raise PackageError(f"program version {version} is not supported; expected {PROGRAM_VERSION}")
    if n > len(buf):
        raise PackageError(f"program claims {n} instructions in {len(buf)} bytes")
    prog = []
    for i in range(n):
        kernel = r.text("<H", f"instruction {i} kernel name")
        ptext = r.text("<I", f"instruction {i} params")
        try:
            params = json.loads(ptext)
        except json.JSONDecodeError as e:
            raise PackageError(f"instruction {i} ({kernel}): params are not valid JSON: {e}") from e
        if not isinstance(params, dict):
            raise PackageError(f"instruction {i} ({kernel}): params must be a JSON object")
        (nops,) = r.unpack("<H", f"instruction {i} operand count")
        ops = []
        for j in range(nops):
            name = r.text("<H", f"instruction {i} operand {j} name")
            mode, seg, code, ndim = r.unpack("<BBBB", f"instruction {i} operand {j}")
            if mode not in (DIRECT, INDIRECT) or seg not in (CONST, HIDDEN, IO):
                raise PackageError(f"instruction {i} ({kernel}) operand '{name}': mode {mode} / segment "
                                   f"{seg} invalid; expected mode 0/1 and segment 0/1/2")
            if (mode == INDIRECT) != (seg == IO):
                raise PackageError(f"instruction {i} ({kernel}) operand '{name}': IO operands are "
                                   f"addressed indirectly and only they are")
            if code >= len(DTYPES):
                raise PackageError(f"instruction {i} ({kernel}) operand '{name}': dtype code {code} unknown")
            seg_off, blk_off, nbytes = r.unpack("<QQQ", f"instruction {i} operand {j} offsets")
            shape = r.unpack(f"<{ndim}Q", f"instruction {i} operand {j} shape")
            dt = DTYPES[code]
            if any(d == 0 for d in shape) or int(np.prod(shape, dtype=object)) * dt.itemsize != nbytes:
                raise PackageError(f"instruction {i} ({kernel}) operand '{name}': shape {shape} x "
                                   f"{dt} does not match its size {nbytes} bytes")
            ops.append(Operand(name, mode, seg, dt, tuple(int(s) for s in shape), seg_off, blk_off))
        if not ops:
            raise PackageError(f"instruction {i} ({kernel}) has no operands")
        prog.append(Instruction(kernel, ops, _untuple(params)))
    if r.pos != len(buf):
        raise PackageError(f"program block has {len(buf) - r.pos} unexpected trailing bytes")
    return prog
