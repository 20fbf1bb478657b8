"""Plots of a series over time without plotting libraries: block characters for a terminal, and
a small PNG (drawn here, encoded with zlib) with a 3x5 pixel font for its labels."""

from __future__ import annotations

import itertools
import struct
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

_EIGHTHS = " ▁▂▃▄▅▆▇█"


@dataclass(frozen=True)
class Series:
    """``values`` at times ``times`` (seconds), plotted under ``title``; ``percent``: values are shares."""

    title: str
    times: Sequence[float]
    values: Sequence[float]
    percent: bool = False


def _label(value: float, percent: bool) -> str:
    if percent:
        return f"{value:.0%}"
    for unit, scale in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(value) >= scale:
            return f"{value / scale:.3g}{unit}"
    return f"{value:.3g}"


def _columns(series: Series, width: int) -> list[float]:
    """The series resampled to ``width`` columns over its time span (each column the mean of its values)."""
    if not series.values:
        return [0.0] * width
    t0, t1 = series.times[0], series.times[-1]
    span = (t1 - t0) or 1.0
    sums, counts = [0.0] * width, [0] * width
    for t, v in zip(series.times, series.values, strict=True):
        c = min(width - 1, int((t - t0) / span * width))
        sums[c] += v
        counts[c] += 1
    out, last = [], 0.0
    for s, n in zip(sums, counts, strict=True):
        last = s / n if n else last
        out.append(last)
    return out


def terminal(series: Series, width: int = 60, height: int = 6) -> str:
    """A chart of block characters, its top value and zero on the left, the time span below."""
    cols = _columns(series, width)
    top = 1.0 if series.percent else max(max(cols, default=0.0), 1e-12)
    left = [_label(top, series.percent), _label(0, series.percent)]
    pad = max(len(s) for s in left)
    lines = [series.title]
    for row in range(height):
        level = (height - 1 - row) * 8  # eighths below this row
        chars = []
        for v in cols:
            eighths = round(min(v, top) / top * height * 8) if top else 0
            chars.append(_EIGHTHS[max(0, min(8, eighths - level))])
        tick = left[0] if row == 0 else left[1] if row == height - 1 else ""
        lines.append(f"{tick:>{pad}} ┤{''.join(chars)}")
    t0, t1 = (series.times[0], series.times[-1]) if series.times else (0.0, 0.0)
    start, end = f"{t0:.0f} s", f"{t1:.0f} s"
    lines.append(" " * pad + " └" + "─" * width)
    lines.append(" " * (pad + 2) + start + " " * max(1, width - len(start) - len(end)) + end)
    return "\n".join(lines)


# -- PNG -----------------------------------------------------------------------------------------

# 3x5 glyphs, rows top to bottom
_FONT = {
    "0": "111101101101111", "1": "010110010010111", "2": "111001111100111", "3": "111001111001111",
    "4": "101101111001001", "5": "111100111001111", "6": "111100111101111", "7": "111001010010010",
    "8": "111101111101111", "9": "111101111001111", "A": "010101111101101", "B": "110101110101110",
    "C": "011100100100011", "D": "110101101101110", "E": "111100110100111", "F": "111100110100100",
    "G": "011100101101011", "H": "101101111101101", "I": "111010010010111", "J": "001001001101010",
    "K": "101101110101101", "L": "100100100100111", "M": "101111111101101", "N": "110101101101101",
    "O": "010101101101010", "P": "110101110100100", "Q": "010101101110011", "R": "110101110101101",
    "S": "011100010001110", "T": "111010010010010", "U": "101101101101111", "V": "101101101101010",
    "W": "101101111111101", "X": "101101010101101", "Y": "101101010010010", "Z": "111001010100111",
    " ": "000000000000000", ".": "000000000000010", ",": "000000000010100", "%": "101001010100101",
    "/": "001001010100100", ":": "000010000010000", "-": "000000111000000", "(": "010100100100010",
    ")": "010001001001010", "=": "000111000111000", "+": "000010111010000",
}  # fmt: skip


class _Canvas:
    def __init__(self, width: int, height: int):
        self.width, self.height = width, height
        self.pixels = bytearray(b"\xff" * (width * height * 3))

    def dot(self, x: int, y: int, rgb: tuple[int, int, int]) -> None:
        if 0 <= x < self.width and 0 <= y < self.height:
            i = (y * self.width + x) * 3
            self.pixels[i : i + 3] = bytes(rgb)

    def line(self, x0: int, y0: int, x1: int, y1: int, rgb: tuple[int, int, int]) -> None:
        dx, dy = abs(x1 - x0), -abs(y1 - y0)
        sx, sy = (1 if x0 < x1 else -1), (1 if y0 < y1 else -1)
        err = dx + dy
        while True:
            self.dot(x0, y0, rgb)
            if x0 == x1 and y0 == y1:
                return
            e2 = 2 * err
            if e2 >= dy:
                err, x0 = err + dy, x0 + sx
            if e2 <= dx:
                err, y0 = err + dx, y0 + sy

    def text(self, x: int, y: int, text: str, rgb: tuple[int, int, int] = (0, 0, 0), scale: int = 2) -> None:
        for ch in text.upper():
            glyph = _FONT.get(ch, _FONT[" "])
            for i, bit in enumerate(glyph):
                if bit == "1":
                    for a in range(scale):
                        for b in range(scale):
                            self.dot(x + (i % 3) * scale + a, y + (i // 3) * scale + b, rgb)
            x += 4 * scale

    def png(self) -> bytes:
        raw = b"".join(
            b"\x00" + bytes(self.pixels[y * self.width * 3 : (y + 1) * self.width * 3]) for y in range(self.height)
        )

        def chunk(kind: bytes, data: bytes) -> bytes:
            return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

        header = struct.pack(">IIBBBBB", self.width, self.height, 8, 2, 0, 0, 0)  # 8-bit RGB
        return (
            b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(raw, 9)) + chunk(b"IEND", b"")
        )


def png(path: str | Path, panels: Sequence[Series], width: int = 720, panel_height: int = 200) -> None:
    """Write ``panels``, one above the other, as a PNG: a line per series over its time span."""
    margin_left, margin_top, margin_bottom = 70, 28, 26
    height = len(panels) * (panel_height + margin_top + margin_bottom)
    canvas = _Canvas(width, height)
    plot_w = width - margin_left - 20
    colors = [(31, 119, 180), (214, 39, 40), (44, 160, 44)]
    for n, series in enumerate(panels):
        y0 = n * (panel_height + margin_top + margin_bottom) + margin_top
        canvas.text(margin_left, y0 - 18, series.title)
        top = 1.0 if series.percent else max(max(series.values, default=0.0), 1e-12)
        for frac in (0.0, 0.5, 1.0):  # grid and value labels
            y = y0 + panel_height - round(frac * panel_height)
            for x in range(margin_left, margin_left + plot_w, 4):
                canvas.dot(x, y, (210, 210, 210))
            canvas.text(4, y - 5, _label(top * frac, series.percent))
        canvas.line(margin_left, y0, margin_left, y0 + panel_height, (0, 0, 0))
        canvas.line(margin_left, y0 + panel_height, margin_left + plot_w, y0 + panel_height, (0, 0, 0))
        times = list(series.times)
        if times:
            t0, span = times[0], (times[-1] - times[0]) or 1.0
            canvas.text(margin_left, y0 + panel_height + 8, f"{t0:.0f} S")
            canvas.text(margin_left + plot_w - 40, y0 + panel_height + 8, f"{times[-1]:.0f} S")
            points = [
                (
                    margin_left + round((t - t0) / span * plot_w),
                    y0 + panel_height - round(min(v, top) / top * panel_height),
                )
                for t, v in zip(times, series.values, strict=True)
            ]
            color = colors[n % len(colors)]
            for (xa, ya), (xb, yb) in itertools.pairwise(points):
                canvas.line(xa, ya, xb, yb, color)
                canvas.line(xa, ya + 1, xb, yb + 1, color)
            if len(points) == 1:
                canvas.dot(*points[0], color)
    Path(path).write_bytes(canvas.png())
