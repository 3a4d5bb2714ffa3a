"""Small networks whose packages cover every runtime kernel, layout and conv algorithm (the
package fuzz tests mutate them). Each compiles in milliseconds and runs in about a millisecond."""
from __future__ import annotations

import hashlib
import json
import struct
import zlib

import numpy as np

import tilefuse
from tilefuse.compiler.memory import align
from tilefuse.compiler.package import FORMAT_VERSION, MAGIC, to_bytes
from tilefuse.compiler.program import CONST, decode, encode


def _w(rng, *shape):
    return (rng.standard_normal(shape) * 0.3).astype(np.float32)


def net_blocked(seed=0):
    """Stem im2col writing NCHW16c, blocked convs (heuristic), residual, pools, scale, GAP, linear."""
    rng = np.random.default_rng(seed)
    net = tilefuse.Network("blocked")
    x = net.input("x", (1, 3, 11, 9))
    y = net.relu(net.conv2d(x, _w(rng, 16, 3, 3, 3), _w(rng, 16), padding=1))
    z = net.conv2d(y, _w(rng, 16, 16, 3, 3), _w(rng, 16), padding=1)
    y = net.relu(net.add(z, y))
    y = net.max_pool(y, 2, ceil_mode=True)                                    # 6 x 5
    s = net.batch_norm(y, gamma=_w(rng, 16) + 1, beta=_w(rng, 16), mean=_w(rng, 16), var=np.ones(16))
    y = net.add(y, s)                                                         # scale, add in NCHW16c
    y = net.conv2d(y, _w(rng, 40, 16, 1, 1), _w(rng, 40))                    # 1x1, Ob = 3
    y = net.relu(net.avg_pool(y, 3, stride=1, padding=1, count_include_pad=False))
    y = net.conv2d(y, _w(rng, 20, 40, 3, 3), None, stride=2, padding=1)     # 3 x 3
    y = net.global_avg_pool(y)
    logits = net.linear(net.flatten(y), _w(rng, 7, 20) * 0.1, _w(rng, 7))
    net.output(logits, net.softmax(logits))
    return net


def net_winograd(seed=1):
    """Only 3x3 stride-1 convs: compiled with algorithm='winograd2' / 'winograd4' (NCHW stem,
    NCHW16c body, residual)."""
    rng = np.random.default_rng(seed)
    net = tilefuse.Network("wino")
    x = net.input("x", (1, 3, 10, 7))
    y = net.relu(net.conv2d(x, _w(rng, 16, 3, 3, 3), _w(rng, 16), padding=1))
    z = net.conv2d(y, _w(rng, 24, 16, 3, 3), _w(rng, 24), padding=(2, 0, 1, 1))
    z = net.conv2d(net.relu(z), _w(rng, 16, 24, 3, 3), _w(rng, 16), padding=(0, 2, 1, 1))
    net.output(net.relu(net.add(z, y)))
    return net


def net_direct(seed=2):
    """Strides, dilation, 1x1 and 5x5 kernels; compiled with algorithm='direct'."""
    rng = np.random.default_rng(seed)
    net = tilefuse.Network("direct")
    x = net.input("x", (2, 5, 13, 12))
    y = net.relu(net.conv2d(x, _w(rng, 17, 5, 5, 5), _w(rng, 17), stride=2, padding=2))   # 7 x 6
    y = net.conv2d(y, _w(rng, 16, 17, 3, 3), _w(rng, 16), padding=2, dilation=2)
    y = net.conv2d(net.relu(y), _w(rng, 32, 16, 1, 1), None, stride=2)                  # 4 x 3
    net.output(net.max_pool(y, 3, stride=1, padding=1))
    return net


def net_nchw(seed=3):
    """layout='nchw': grouped im2col, reference-free kernels in NCHW, LRN, concat, dropout."""
    rng = np.random.default_rng(seed)
    net = tilefuse.Network("plain")
    x = net.input("x", (1, 4, 9, 8))
    a = net.relu(net.conv2d(x, _w(rng, 6, 2, 3, 3), _w(rng, 6), padding=1, groups=2))
    b = net.conv2d(x, _w(rng, 5, 4, 1, 1), _w(rng, 5))
    y = net.concat([a, b], axis=1)
    y = net.local_response_norm(y, size=3)
    y = net.batch_norm(y, gamma=_w(rng, 11) + 1, beta=_w(rng, 11), mean=_w(rng, 11), var=np.ones(11))
    y = net.avg_pool(y, 2, ceil_mode=True)                                            # 5 x 4
    y = net.dropout(net.flatten(y), 0.3)
    net.output(net.linear(y, _w(rng, 3, 220), _w(rng, 3), ), net.global_avg_pool(a))
    return net


VARIANTS = {
    "blocked": (net_blocked, {}),
    "blocked-direct": (net_blocked, {"algorithm": "direct"}),
    "wino2": (net_winograd, {"algorithm": "winograd2"}),
    "wino4": (net_winograd, {"algorithm": "winograd4"}),
    "direct": (net_direct, {"algorithm": "direct"}),
    "direct-nchw": (net_direct, {"algorithm": "direct", "layout": "nchw"}),
    "nchw": (net_nchw, {"layout": "nchw"}),
    "reference": (net_nchw, {"algorithm": "reference"}),
    # the row-band schedule: a stream region (header, band instructions, rings) and a tail
    "stream": (net_blocked, {"schedule": "stream", "stream_options": {"band_rows": 2}}),
    "stream-nchw": (net_nchw, {"schedule": "stream", "stream_options": {"band_rows": 3, "layout": "nchw",
                                                                        "workers": 2}}),
}


def compiled(name):
    make, opts = VARIANTS[name]
    net = make()
    return net, tilefuse.compile(net, threads=1, **opts)


def inputs_for(pkg, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(s.shape).astype(s.dtype) for s in pkg.inputs]


# ----------------------------------------------------------------------------- parts <-> bytes

def split(pkg):
    blob = to_bytes(pkg)
    hlen = struct.unpack_from("<I", blob, 12)[0]
    h = json.loads(blob[16:16 + hlen])
    area = bytearray(blob[align(16 + hlen + 4):])
    return h, decode(bytes(area[:h["program_size"]])), area


def join(h, prog, area, raw=None) -> bytes:
    """Re-encode the program into the constant area (moving the constants if its aligned size
    changed), then re-sign: what anyone can do to a package file."""
    old = h["program_size"]
    body, _ = encode(prog)
    delta = align(len(body)) - align(old)
    if delta:
        for b in h["blocks"]:
            if b["segment"] == "const" and b["offset"] >= old:
                b["offset"] += delta
        for ins in prog:
            for op in ins.operands:
                if op.segment == CONST and op.seg_offset >= old:
                    op.seg_offset += delta
        body, _ = encode(prog)
        area = bytearray(align(len(body))) + area[align(old):]
        h["tags"]["const_bytes"] += delta
    area[:align(len(body))] = bytes(body) + bytes(align(len(body)) - len(body))
    h["program_size"] = len(body)
    if raw is not None:
        pos, val = raw
        area[pos % len(body)] = val
    h["const_sha256"] = hashlib.sha256(area).hexdigest()
    head = json.dumps(h).encode()
    pre = MAGIC + struct.pack("<II", FORMAT_VERSION, len(head)) + head + struct.pack("<I", zlib.crc32(head))
    return pre + b"\0" * (align(len(pre)) - len(pre)) + bytes(area)
