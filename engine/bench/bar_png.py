"""A horizontal bar chart written as a PNG file with the standard library alone (zlib and struct).

The arena's leaderboard must come out as a picture from the command line and from the page; plotly's static
export needs kaleido, which is not installed, and matplotlib is no dependency. Bars are few and labels short,
so the chart is drawn on an RGB canvas, its text in a 3x5 pixel font (capitals, digits and the signs drafter
names and numbers use; each glyph five rows of three pixels, top row first), and encoded as an 8-bit truecolour
PNG: one IHDR, one IDAT of unfiltered rows, IEND.
"""

from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass, field
from pathlib import Path

from engine.plotstyle import BLUE, RULE

SIGNATURE = b"\x89PNG\r\n\x1a\n"
WHITE, INK = (255, 255, 255), (31, 41, 55)

GLYPH_W, GLYPH_H = 3, 5  # a glyph's pixels

GLYPHS = {
    "A": "010 101 111 101 101", "B": "110 101 110 101 110", "C": "011 100 100 100 011",
    "D": "110 101 101 101 110", "E": "111 100 110 100 111", "F": "111 100 110 100 100",
    "G": "011 100 101 101 011", "H": "101 101 111 101 101", "I": "111 010 010 010 111",
    "J": "001 001 001 101 010", "K": "101 101 110 101 101", "L": "100 100 100 100 111",
    "M": "101 111 111 101 101", "N": "110 101 101 101 101", "O": "010 101 101 101 010",
    "P": "110 101 110 100 100", "Q": "010 101 101 110 011", "R": "110 101 110 101 101",
    "S": "011 100 010 001 110", "T": "111 010 010 010 010", "U": "101 101 101 101 111",
    "V": "101 101 101 101 010", "W": "101 101 111 111 101", "X": "101 101 010 101 101",
    "Y": "101 101 010 010 010", "Z": "111 001 010 100 111",
    "0": "111 101 101 101 111", "1": "010 110 010 010 111", "2": "110 001 010 100 111",
    "3": "110 001 010 001 110", "4": "101 101 111 001 001", "5": "111 100 110 001 110",
    "6": "011 100 111 101 111", "7": "111 001 010 010 010", "8": "111 101 111 101 111",
    "9": "111 101 111 001 110",
    " ": "000 000 000 000 000", "-": "000 000 111 000 000", ".": "000 000 000 000 010",
    ",": "000 000 000 010 100", ":": "000 010 000 010 000", "/": "001 001 010 100 100",
    "(": "010 100 100 100 010", ")": "010 001 001 001 010", "=": "000 111 000 111 000",
    "+": "000 010 111 010 000", "_": "000 000 000 000 111", "%": "101 001 010 100 101",
    "?": "110 001 010 000 010",
}


def glyph(ch: str) -> list[str]:
    """The five rows of a character (lower case drawn as capitals, anything unknown as '?')."""
    return GLYPHS.get(ch.upper(), GLYPHS["?"]).split()


def text_width(text: str, scale: int) -> int:
    """Pixels a line of text takes at this scale: each glyph and one column of space after it."""
    return len(text) * (GLYPH_W + 1) * scale


def rgb(hex_colour: str) -> tuple[int, int, int]:
    h = hex_colour.lstrip("#")
    return int(h[0:2], 16), int(h[2:4], 16), int(h[4:6], 16)


class Canvas:
    """An RGB picture, row-major, filled with white."""

    def __init__(self, width: int, height: int):
        self.width, self.height = width, height
        self.pixels = bytearray(WHITE * (width * height))

    def rect(self, x: int, y: int, w: int, h: int, colour: tuple[int, int, int]) -> None:
        x0, y0 = max(0, x), max(0, y)
        x1, y1 = min(self.width, x + w), min(self.height, y + h)
        if x1 <= x0 or y1 <= y0:
            return
        line = bytes(colour) * (x1 - x0)
        for yy in range(y0, y1):
            at = (yy * self.width + x0) * 3
            self.pixels[at:at + len(line)] = line

    def text(self, x: int, y: int, text: str, colour: tuple[int, int, int] = INK, scale: int = 2) -> None:
        """Text with its top left corner at (x, y)."""
        step = (GLYPH_W + 1) * scale
        for n, ch in enumerate(text):
            for row, bits in enumerate(glyph(ch)):
                for col, bit in enumerate(bits):
                    if bit == "1":
                        self.rect(x + n * step + col * scale, y + row * scale, scale, scale, colour)

    def png(self) -> bytes:
        def chunk(kind: bytes, data: bytes) -> bytes:
            return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

        stride = self.width * 3
        # filter type 0 (none) before each row
        raw = b"".join(b"\x00" + bytes(self.pixels[y * stride:(y + 1) * stride]) for y in range(self.height))
        header = struct.pack(">IIBBBBB", self.width, self.height, 8, 2, 0, 0, 0)  # 8-bit RGB, no interlace
        return SIGNATURE + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(raw, 9)) + chunk(b"IEND", b"")


@dataclass
class BarChart:
    title: str  # the line above the bars
    labels: list[str]  # one per bar, top to bottom
    values: list[float]  # bar lengths, same order
    colours: list[str] = field(default_factory=list)  # "#rrggbb" per bar; missing ones are blue
    value_format: str = ".2f"  # the number written after each bar
    width: int = 720  # pixels
    bar_height: int = 22  # pixels per bar; the gap between bars is half of it
    scale: int = 2  # text pixels per font pixel


def draw(chart: BarChart) -> Canvas:
    s = chart.scale
    line_h = (GLYPH_H + 2) * s
    label_w = max((text_width(t, s) for t in chart.labels), default=0) + 12
    value_w = text_width(format(max(chart.values, default=0.0), chart.value_format), s) + 12
    top, gap = 16 + 2 * line_h, chart.bar_height // 2
    height = top + len(chart.labels) * (chart.bar_height + gap) + 16
    c = Canvas(chart.width, height)
    c.text(12, 12, chart.title, scale=s)
    x0 = 12 + label_w
    span = max(1, chart.width - x0 - value_w - 12)
    peak = max(max(chart.values, default=0.0), 1e-9)
    c.rect(x0 - 1, top - gap // 2, 1, height - top - 8, rgb(RULE))  # the axis the bars start from
    for i, (label, value) in enumerate(zip(chart.labels, chart.values)):
        y = top + i * (chart.bar_height + gap)
        colour = rgb(chart.colours[i] if i < len(chart.colours) else BLUE)
        length = int(round(span * max(0.0, value) / peak))
        text_y = y + (chart.bar_height - GLYPH_H * s) // 2
        c.text(12, text_y, label, scale=s)
        c.rect(x0, y, length, chart.bar_height, colour)
        c.text(x0 + length + 6, text_y, format(value, chart.value_format), scale=s)
    return c


def write_bar_png(chart: BarChart, path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(draw(chart).png())
    return path
