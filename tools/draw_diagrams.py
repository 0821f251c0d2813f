"""Draw the documentation's two diagrams as static SVG files (no JavaScript, no network).

Run from the repository root: ``python tools/draw_diagrams.py``; it rewrites
``docs/img/pipeline.svg`` and ``docs/img/layers.svg``.
"""

from __future__ import annotations

import itertools
from pathlib import Path
from xml.sax.saxutils import escape

OUT = Path(__file__).resolve().parents[1] / "docs" / "img"
FONT = "font-family='Helvetica, Arial, sans-serif' font-size='13'"
CHAR = 7.2  # average width of a character at 13 px


class Svg:
    def __init__(self, width: int, height: int):
        self.w, self.h, self.parts = width, height, []

    def box(self, cx, cy, text, *, fill="#e8eefc", stroke="#3b5bdb", diamond=False):
        w, h = len(text) * CHAR + 28, 34
        if diamond:
            pts = f"{cx - w / 2 - 10},{cy} {cx},{cy - h / 2 - 8} {cx + w / 2 + 10},{cy} " \
                  f"{cx},{cy + h / 2 + 8}"
            self.parts.append(f"<polygon points='{pts}' fill='#fff4e6' stroke='#e8590c'/>")
        else:
            self.parts.append(
                f"<rect x='{cx - w / 2}' y='{cy - h / 2}' width='{w}' height='{h}' rx='6' "
                f"fill='{fill}' stroke='{stroke}'/>")
        self.parts.append(f"<text x='{cx}' y='{cy + 4.5}' text-anchor='middle' {FONT}>"
                          f"{escape(text)}</text>")

    def arrow(self, x1, y1, x2, y2, *, dashed=False, path=None):
        dash = " stroke-dasharray='5 4'" if dashed else ""
        d = path or f"M{x1},{y1} L{x2},{y2}"
        self.parts.append(f"<path d='{d}' fill='none' stroke='#495057' stroke-width='1.4'"
                          f"{dash} marker-end='url(#head)'/>")

    def write(self, path: Path, title: str):
        head = ("<defs><marker id='head' viewBox='0 0 10 10' refX='9' refY='5' markerWidth='7' "
                "markerHeight='7' orient='auto-start-reverse'><path d='M0,0 L10,5 L0,10 z' "
                "fill='#495057'/></marker></defs>")
        label = escape(title, {"'": "&apos;"})
        svg = (f"<svg xmlns='http://www.w3.org/2000/svg' width='{self.w}' height='{self.h}' "
               f"viewBox='0 0 {self.w} {self.h}' role='img' aria-label='{label}'>"
               f"<title>{escape(title)}</title><rect width='100%' height='100%' fill='white'/>"
               f"{head}{''.join(self.parts)}</svg>\n")
        path.write_text(svg, encoding="utf-8")


def pipeline():
    s = Svg(820, 470)
    cx, rx, lx = 500, 500, 200
    rows = [30, 95, 160, 235, 310, 375, 440]
    s.box(cx, rows[0], "kernel(*inputs, outs=..., **params)")
    s.box(cx, rows[1], "one named JAX primitive")
    s.box(lx, rows[2], "rules: abstract eval, JVP, transpose, batching")
    s.box(rx + 80, rows[2], "lowering")
    s.box(rx + 80, rows[3], "backend: call > use_backend > default", diamond=True)
    s.box(rx + 80, rows[4], "kernel generator(**params, ins, outs, platform)")
    s.box(rx + 80, rows[5], "backend: its product as a JAX callable")
    s.box(rx + 80, rows[6], "XLA: HLO, FFI custom call, Triton or Mosaic kernel")
    s.arrow(cx, rows[0] + 17, cx, rows[1] - 17)
    s.arrow(cx - 60, rows[1] + 17, lx + 40, rows[2] - 17)
    s.arrow(cx + 40, rows[1] + 17, rx + 80, rows[2] - 17)
    s.arrow(rx + 80, rows[2] + 17, rx + 80, rows[3] - 25)
    s.arrow(rx + 80, rows[3] + 25, rx + 80, rows[4] - 17)
    s.arrow(rx + 80, rows[4] + 17, rx + 80, rows[5] - 17)
    s.arrow(rx + 80, rows[5] + 17, rx + 80, rows[6] - 17)
    s.arrow(0, 0, 0, 0, dashed=True, path=f"M{lx},{rows[2] + 17} C{lx},{rows[3] + 30} "
            f"{rx - 120},{rows[2] + 40} {rx + 40},{rows[2] + 12}")
    s.parts.append(f"<text x='{lx - 40}' y='{rows[3] + 10}' {FONT} font-style='italic' "
                   "fill='#495057'>vmap: one native call</text>")
    s.write(OUT / "pipeline.svg", "From a kernel call to XLA: the primitive, its rules and "
            "the lowering that picks a backend")


def layers():
    names = ["8 entry points: cli, primforge/__init__", "7 simulation: sim.coba",
             "6 library: ops, testing", "5 autotune",
             "4 kernel: XLACustomKernel and its parts, hooks", "3 store: registry, bench",
             "2 backends: backends", "1 core: utils, primitive, rules",
             "0 leaves: _compat, _cache, debug, sim's loop tools"]
    s = Svg(720, 60 * len(names) + 10)
    cx = 250
    ys = [30 + 60 * i for i in range(len(names))]
    for y, name in zip(ys, names):
        s.box(cx, y, name)
    for a, b in itertools.pairwise(ys):
        s.arrow(cx, a + 17, cx, b - 17)
    y5, y4 = ys[3], ys[4]  # autotune, kernel
    s.arrow(0, 0, 0, 0, dashed=True,
            path=f"M{cx + 60},{y5} C{cx + 230},{y5} {cx + 230},{y4} {cx + 170},{y4 - 10}")
    s.parts.append(f"<text x='{cx + 205}' y='{(y5 + y4) / 2 + 4}' {FONT} font-style='italic' "
                   "fill='#495057'>subscribes to kernel events</text>")
    s.write(OUT / "layers.svg", "primforge's import layers: each imports only the ones below")


if __name__ == "__main__":
    pipeline()
    layers()
