"""A horizontal bar chart as a PNG, with numpy and zlib only (no plotting library needed).

    write_bar_chart(path, labels, values, notes=None, title="", unit="ms")

One bar per row, its label on the left, `notes` (free text) after the bar. Text is drawn with a
built-in 5x7 pixel font (letters are shown lower case; characters it lacks become '?'). The PNG
is 8-bit RGB, written by `write_png` (signature, IHDR, one zlib IDAT, IEND).
"""
from __future__ import annotations

import struct
import zlib

import numpy as np

# 5x7 glyphs: 7 rows of 5 bits, most significant bit left
_FONT = {
    " ": (0, 0, 0, 0, 0, 0, 0), "?": (14, 17, 1, 2, 4, 0, 4), ".": (0, 0, 0, 0, 0, 12, 12),
    ",": (0, 0, 0, 0, 12, 4, 8), ":": (0, 12, 12, 0, 12, 12, 0), "-": (0, 0, 0, 31, 0, 0, 0),
    "_": (0, 0, 0, 0, 0, 0, 31), "+": (0, 4, 4, 31, 4, 4, 0), "/": (1, 1, 2, 4, 8, 16, 16),
    "%": (24, 25, 2, 4, 8, 19, 3), "(": (2, 4, 8, 8, 8, 4, 2), ")": (8, 4, 2, 2, 2, 4, 8),
    "=": (0, 0, 31, 0, 31, 0, 0), ">": (8, 4, 2, 1, 2, 4, 8), "<": (2, 4, 8, 16, 8, 4, 2),
    "[": (14, 8, 8, 8, 8, 8, 14), "]": (14, 2, 2, 2, 2, 2, 14), "#": (10, 10, 31, 10, 31, 10, 10),
    "0": (14, 17, 19, 21, 25, 17, 14), "1": (4, 12, 4, 4, 4, 4, 14), "2": (14, 17, 1, 2, 4, 8, 31),
    "3": (31, 2, 4, 2, 1, 17, 14), "4": (2, 6, 10, 18, 31, 2, 2), "5": (31, 16, 30, 1, 1, 17, 14),
    "6": (6, 8, 16, 30, 17, 17, 14), "7": (31, 1, 2, 4, 8, 8, 8), "8": (14, 17, 17, 14, 17, 17, 14),
    "9": (14, 17, 17, 15, 1, 2, 12),
    "a": (0, 0, 14, 1, 15, 17, 15), "b": (16, 16, 22, 25, 17, 17, 30), "c": (0, 0, 14, 16, 16, 17, 14),
    "d": (1, 1, 13, 19, 17, 17, 15), "e": (0, 0, 14, 17, 31, 16, 14), "f": (6, 9, 8, 28, 8, 8, 8),
    "g": (0, 15, 17, 17, 15, 1, 14), "h": (16, 16, 22, 25, 17, 17, 17), "i": (4, 0, 12, 4, 4, 4, 14),
    "j": (2, 0, 6, 2, 2, 18, 12), "k": (16, 16, 18, 20, 24, 20, 18), "l": (12, 4, 4, 4, 4, 4, 14),
    "m": (0, 0, 26, 21, 21, 17, 17), "n": (0, 0, 22, 25, 17, 17, 17), "o": (0, 0, 14, 17, 17, 17, 14),
    "p": (0, 0, 30, 17, 30, 16, 16), "q": (0, 0, 13, 19, 15, 1, 1), "r": (0, 0, 22, 25, 16, 16, 16),
    "s": (0, 0, 14, 16, 14, 1, 30), "t": (8, 8, 28, 8, 8, 9, 6), "u": (0, 0, 17, 17, 17, 19, 13),
    "v": (0, 0, 17, 17, 17, 10, 4), "w": (0, 0, 17, 17, 21, 21, 10), "x": (0, 0, 17, 10, 4, 10, 17),
    "y": (0, 0, 17, 17, 15, 1, 14), "z": (0, 0, 31, 2, 4, 8, 31),
}
CHAR_W, CHAR_H = 6, 9           # advance and line height in pixels (glyphs are 5x7)


def draw_text(img: np.ndarray, x: int, y: int, text: str, color=(0, 0, 0)) -> int:
    """Draw `text` with its top-left corner at (x, y); returns the x after it. Clipped to img."""
    h, w, _ = img.shape
    for ch in text.lower():
        rows = _FONT.get(ch, _FONT["?"])
        for r, bits in enumerate(rows):
            for c in range(5):
                if bits >> (4 - c) & 1:
                    yy, xx = y + r, x + c
                    if 0 <= yy < h and 0 <= xx < w:
                        img[yy, xx] = color
        x += CHAR_W
    return x


def write_png(path, img: np.ndarray) -> None:
    """img (H, W, 3) uint8 -> an RGB PNG file."""
    img = np.ascontiguousarray(img, np.uint8)
    if img.ndim != 3 or img.shape[2] != 3:
        raise ValueError(f"write_png: image has shape {img.shape}, expected (H, W, 3)")
    h, w, _ = img.shape
    raw = np.empty((h, 1 + 3 * w), np.uint8)
    raw[:, 0] = 0                                  # filter type 0 (none) per scanline
    raw[:, 1:] = img.reshape(h, 3 * w)

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    png = (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0))
           + chunk(b"IDAT", zlib.compress(raw.tobytes(), 6)) + chunk(b"IEND", b""))
    with open(path, "wb") as f:
        f.write(png)


def write_bar_chart(path, labels, values, notes=None, title: str = "", unit: str = "ms", colors=None) -> None:
    """One horizontal bar per (label, value >= 0); notes[i] is written after bar i."""
    values = [max(0.0, float(v)) for v in values]
    notes = list(notes) if notes is not None else [f"{v:.3g} {unit}" for v in values]
    n = len(values)
    if n == 0 or len(labels) != n or len(notes) != n:
        raise ValueError(f"write_bar_chart: {len(labels)} labels, {n} values, {len(notes)} notes; expected equal, > 0")
    label_w = CHAR_W * max(len(str(s)) for s in labels) + 10
    note_w = CHAR_W * max(len(str(s)) for s in notes) + 10
    bar_w, row_h, top = 420, 12, 30 if title else 10
    width, height = label_w + bar_w + note_w + 10, top + n * row_h + 10
    img = np.full((height, width, 3), 255, np.uint8)
    if title:
        draw_text(img, 10, 10, title)
    vmax = max(values) or 1.0
    colors = colors or [(70, 110, 180)] * n
    for i, (lab, v, note) in enumerate(zip(labels, values, notes)):
        y = top + i * row_h
        draw_text(img, 5, y + 2, str(lab))
        x0 = label_w
        x1 = x0 + max(1, int(round(bar_w * v / vmax)))
        img[y + 1:y + row_h - 1, x0:x1] = colors[i]
        draw_text(img, x1 + 4, y + 2, str(note), (60, 60, 60))
    img[top - 2:top + n * row_h, label_w - 1] = (0, 0, 0)          # axis
    write_png(path, img)
