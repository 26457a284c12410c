"""The built site shows its code whole at a 1,400 px window, and its figure legibly.

The PyData theme sets the article between two side columns; ``docs/_static/custom.css``
narrows them, widens the article and sets code at 13 px, with its numbers as ``--rh-*``
variables. This test reads them and computes the width of a code block's text at a 1,400 px
window, less a 15 px scrollbar, with both side columns shown (the narrowest case). Every code
block of the built site must fit it: its longest line x the widest advance of the theme's
monospace fonts (0.602 em: DejaVu Sans Mono, Menlo; SF Mono, Source Code Pro, Cascadia Code
and Consolas are narrower), after the indent of the lists and API entries it sits in. A new
over-long block fails here: wrap it (a command over several lines with ``\\``, a shorter
comment), or, for a program's output wider than any screen, list it in ``WIDE_OUTPUTS`` with
why (it scrolls sideways).

With Chromium installed, ``test_pages_in_a_browser`` opens the pages of issue 48's
screenshots at 1,400 px and measures that no code block or table overflows and that the
computed width is the browser's; ``RH_DOCS_SCREENSHOTS=DIR`` also saves their screenshots.
"""

from __future__ import annotations

import html
import json
import math
import os
import re
import shutil
import struct
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path
from typing import ClassVar

import pytest
from docs_site import DOCS, built_site

CSS = DOCS / "_static" / "custom.css"
WINDOW_PX = 1400
SCROLLBAR_PX = 15
#: The widest advance among the theme's monospace fonts, in em (DejaVu Sans Mono: 1233/2048).
CHAR_EM = 0.6021
ROOT_PX = 16.0
PRE_BORDER_PX = 1.0
#: What each enclosing element indents a block by (px), from the theme's CSS:
#: ``ol,ul{padding-left:2rem}``; an API entry's ``dd`` (measured: 32 px); a blockquote's
#: ``padding:1em`` + ``border-left:.25em``; an admonition's ``padding:0 .6rem`` +
#: ``border-left:.2rem`` (both sides' padding counted).
INDENT_PX = {"li": 32.0, "dd": 32.0, "blockquote": 36.0, "admonition": 23.0}

#: Program outputs wider than any screen, shown as printed (they scroll sideways), by page and
#: their first line's start, with what they are.
WIDE_OUTPUTS = {
    ("benchmarks/performance.html", "scenario hetero3:"): "python -m benchmarks' table",
    ("benchmarks/performance.html", "scenario hetero2:"): "python -m benchmarks' table",
    ("benchmarks/performance.html", "scenario drift:"): "python -m benchmarks' table",
    ("benchmarks/performance.html", "scenario homogeneous3:"): "python -m benchmarks' tables",
    ("benchmarks/performance.html", "scenario join:"): "python -m benchmarks' table",
    ("benchmarks/performance.html", "workers  strategy"): "raytrain-hetero sim's table",
    ("concepts/admission.html", "plan v1: slices"): "raytrain-hetero probe's log lines",
    ("design/tune-allocation.html", "allocation: 613b2_00001"): "raytrain-hetero tune's line",
    ("how-to/autoscaling.html", "head up at"): "scripts/autoscaling_demo.py's log",
    ("reliability/faults.html", "faults injected:"): "benchmarks/soak.py's summary",
    ("how-to/rent.html", "time        cost"): "raytrain-hetero rent's table",
    ("concepts/group-decision.html", "group (train):"): "a group decision's log line",
}

# ---------------------------------------------------------------------- the content width


def css_variables(text: str) -> dict[str, float]:
    """``--rh-NAME: VALUE`` declarations of custom.css, in px (rem and em at 16 px)."""
    out = {}
    for name, value, unit in re.findall(r"--rh-([\w-]+):\s*([\d.]+)(rem|em|px)\s*;", text):
        out[name] = float(value) * (ROOT_PX if unit in {"rem", "em"} else 1.0)
    return out


VARIABLES = css_variables(CSS.read_text())
NEEDED = (
    "sidebar-primary-width",
    "sidebar-secondary-width",
    "article-padding-x",
    "article-padding-left",
    "code-font-size",
    "code-padding-x",
)


def code_text_width(indent_px: float = 0.0, scrollbar_px: float = SCROLLBAR_PX) -> float:
    """Width (px) of a code block's text at the 1,400 px window, both side columns shown."""
    v = VARIABLES
    main = WINDOW_PX - scrollbar_px - v["sidebar-primary-width"] - v["sidebar-secondary-width"]
    article = main - 2 * v["article-padding-x"] - v["article-padding-left"]
    return article - indent_px - 2 * v["code-padding-x"] - 2 * PRE_BORDER_PX


def char_px() -> float:
    return VARIABLES["code-font-size"] * CHAR_EM


def max_columns(indent_px: float = 0.0) -> int:
    return math.floor(code_text_width(indent_px) / char_px())


def test_custom_css_declares_and_uses_every_width() -> None:
    """The variables the computation reads exist and each is used by a rule (a variable that
    is declared but no longer applied would make this test check a fiction)."""
    text = CSS.read_text()
    for name in NEEDED:
        assert name in VARIABLES, f"custom.css lost --rh-{name}"
        assert f"var(--rh-{name})" in text, f"--rh-{name} is declared but used by no rule"
    conf = (DOCS / "conf.py").read_text()
    assert '"custom.css"' in conf and "pydata_sphinx_theme" in conf


def test_code_gets_at_least_100_columns() -> None:
    assert max_columns() >= 100, f"only {max_columns()} columns of code at {WINDOW_PX} px"


# ------------------------------------------------------------------- the built code blocks


class _CodeBlocks(HTMLParser):
    """Each ``div.highlight > pre`` of a page: (its text, the indent of its ancestors)."""

    VOID: ClassVar[set[str]] = {
        "area",
        "br",
        "col",
        "embed",
        "hr",
        "img",
        "input",
        "link",
        "meta",
        "source",
        "wbr",
    }

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.stack: list[tuple[str, set[str]]] = []
        self.blocks: list[tuple[str, float]] = []
        self._text: list[str] | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag in self.VOID:
            return
        classes = set((dict(attrs).get("class") or "").split())
        if tag == "pre" and self.stack and "highlight" in self.stack[-1][1]:
            self._text = []
        self.stack.append((tag, classes))

    def handle_endtag(self, tag: str) -> None:
        if tag == "pre" and self._text is not None:
            indent = sum(
                INDENT_PX["admonition"] if "admonition" in classes else INDENT_PX.get(name, 0.0)
                for name, classes in self.stack[:-1]
            )
            self.blocks.append(("".join(self._text), indent))
            self._text = None
        for i in range(len(self.stack) - 1, -1, -1):
            if self.stack[i][0] == tag:
                del self.stack[i:]
                break

    def handle_data(self, data: str) -> None:
        if self._text is not None:
            self._text.append(data)


def code_blocks(page: Path) -> list[tuple[str, float]]:
    parser = _CodeBlocks()
    parser.feed(page.read_text(encoding="utf-8"))
    return parser.blocks


def _pages(root: Path) -> list[Path]:
    skip = {"_static", "_sources", "_modules", "_images", "_downloads"}
    return sorted(
        p
        for p in root.rglob("*.html")
        if not skip & set(p.relative_to(root).parts)
        and p.name not in {"search.html", "genindex.html"}
    )


def _first_line(text: str) -> str:
    return next((line.strip() for line in text.splitlines() if line.strip()), "")


def _wide_output(page: str, text: str) -> bool:
    return any(page == p and _first_line(text).startswith(s) for p, s in WIDE_OUTPUTS)


@pytest.fixture(scope="module")
def site() -> Path:
    built = built_site()
    assert built.returncode == 0, built.output[-4000:]
    return built.html


def over_long(root: Path) -> list[tuple[str, str, int, int]]:
    """(page, first line, longest line, columns it has) of each block that does not fit."""
    out = []
    for page in _pages(root):
        name = str(page.relative_to(root))
        for text, indent in code_blocks(page):
            longest = max((len(line.expandtabs(8)) for line in text.splitlines()), default=0)
            room = max_columns(indent)
            if longest > room and not _wide_output(name, text):
                out.append((name, _first_line(text)[:60], longest, room))
    return out


def test_every_code_block_fits_the_article(site: Path) -> None:
    blocks = [b for page in _pages(site) for b in code_blocks(page)]
    assert len(blocks) >= 100  # the parser finds the site's code
    bad = over_long(site)
    assert not bad, f"code blocks wider than the article at {WINDOW_PX} px:\n" + "\n".join(
        f"  {page}: {line!r}...: {n} characters, room for {room}" for page, line, n, room in bad
    )


def test_wide_outputs_are_listed_only_while_they_exist(site: Path) -> None:
    for page, start in WIDE_OUTPUTS:
        texts = [t for t, _ in code_blocks(site / page) if _first_line(t).startswith(start)]
        assert texts, f"WIDE_OUTPUTS: no block starting {start!r} on {page} any more"
        assert any(max(len(line) for line in t.splitlines()) > max_columns() for t in texts), (
            f"WIDE_OUTPUTS: {page} {start!r} fits now; remove it from the list"
        )


def test_a_long_line_fails(tmp_path: Path) -> None:
    page = tmp_path / "page.html"
    line = "x" * (max_columns(INDENT_PX["li"]) + 1)
    page.write_text(
        f'<ul><li><div class="highlight"><pre>{html.escape(line)}\nshort</pre></div></li></ul>'
        f'<div class="highlight"><pre>{line}</pre></div>'
    )
    assert [(n, room) for _, _, n, room in over_long(tmp_path)] == [
        (len(line), max_columns(INDENT_PX["li"]))
    ]


def test_tables_wrap_their_cells() -> None:
    """Table cells wrap, long literals included, so no table is wider than the article (the
    browser test measures it where Chromium is installed)."""
    text = re.sub(r"\s+", " ", CSS.read_text())
    assert re.search(r"\.bd-content table td code,[^{]*\{ overflow-wrap: anywhere;", text)


# ------------------------------------------------------------------------------- figure

#: The legibility bar: the figure's smallest text, in CSS px, at the width the pages show it.
MIN_FIGURE_TEXT_PX = 14.0


def _cycle_script() -> object:
    import importlib.util

    spec = importlib.util.spec_from_file_location("cycle", DOCS / "_scripts" / "cycle_diagram.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_cycle_figure_text_is_legible() -> None:
    """The landing page's figure: its smallest text is page-sized where it is shown, and the
    committed PNG is the script's (its size) at twice the displayed pixels."""
    cycle = _cycle_script()
    shown_px_per_inch = cycle.DISPLAY_WIDTH_PX / cycle.FIGSIZE[0]
    smallest = min(cycle.FONT_PT.values()) / 72 * shown_px_per_inch
    assert smallest >= MIN_FIGURE_TEXT_PX, f"{smallest:.1f} px"
    for page in (DOCS / "index.md", DOCS / "concepts" / "how-it-works.md"):
        figure = re.search(
            r"```\{figure\} \S*cycle\.png\n(?P<options>(?::.*\n)*)", page.read_text()
        )
        assert figure, page
        assert f":width: {cycle.DISPLAY_WIDTH_PX}px" in figure.group("options"), page
    width, height = struct.unpack(">II", cycle.OUT.read_bytes()[16:24])  # the PNG's IHDR
    assert (width, height) == (
        round(cycle.FIGSIZE[0] * cycle.DPI),
        round(cycle.FIGSIZE[1] * cycle.DPI),
    ), "docs/concepts/cycle.png is not the script's: run python docs/_scripts/cycle_diagram.py"
    assert width >= 2 * cycle.DISPLAY_WIDTH_PX


# ------------------------------------------------------------------------- in a browser

#: Issue 48's screenshots: the landing page, the configuration reference, the Tune how-to
#: (and the Python API page, whose table was the widest).
BROWSER_PAGES = ["index", "reference/configuration", "how-to/tune", "how-to/python-api"]
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--hide-scrollbars",
    f"--window-size={WINDOW_PX},2000",
    "--virtual-time-budget=3000",
]
_MEASURE = """<script>
window.addEventListener('load', () => setTimeout(() => {
  const over = (e) => e.scrollWidth > e.clientWidth + 1;
  const pres = [...document.querySelectorAll('article div.highlight pre')];
  const out = {
    pres: pres.map((p) => {
      const s = getComputedStyle(p);
      return {first: p.textContent.trim().split('\\n')[0], over: over(p),
              text: p.clientWidth - parseFloat(s.paddingLeft) - parseFloat(s.paddingRight),
              nested: !!p.closest('li, dd, blockquote, .admonition')};
    }),
    tables: [...document.querySelectorAll('article table')].map((t) => over(t.parentElement)
      || t.getBoundingClientRect().right > document.querySelector('article').getBoundingClientRect().right + 1),
    secondary: !!document.querySelector('.bd-sidebar-secondary'),
  };
  const pre = document.createElement('pre'); pre.id = '__rh_layout';
  pre.textContent = JSON.stringify(out); document.body.appendChild(pre);
}, 300));
</script></body>"""


def _measure(page: Path) -> dict:
    probe = page.with_name(f"__layout_{page.name}")
    probe.write_text(page.read_text(encoding="utf-8").replace("</body>", _MEASURE))
    try:
        proc = subprocess.run(
            [CHROMIUM, *_FLAGS, "--dump-dom", probe.as_uri()],
            capture_output=True,
            text=True,
            timeout=120,
        )
    finally:
        probe.unlink()
    found = re.search(r'<pre id="__rh_layout"[^>]*>([^<]*)</pre>', proc.stdout)
    assert found, f"{page}: no measurement ({proc.returncode}): {proc.stderr[-500:]}"
    return json.loads(html.unescape(found.group(1)))


@pytest.mark.skipif(CHROMIUM is None, reason="no Chromium (apt-get install chromium)")
@pytest.mark.parametrize("name", BROWSER_PAGES)
def test_pages_in_a_browser(site: Path, name: str) -> None:
    page = site / f"{name}.html"
    found = _measure(page)
    rel = f"{name}.html"
    cut = [
        p["first"][:60] for p in found["pres"] if p["over"] and not _wide_output(rel, p["first"])
    ]
    assert not cut, f"{rel}: code blocks cut off at {WINDOW_PX} px: {cut}"
    assert not any(found["tables"]), f"{rel}: {sum(found['tables'])} tables wider than the article"
    if found["secondary"]:  # both columns shown: the computed width is the browser's
        for p in found["pres"]:
            if not p["nested"]:
                assert abs(p["text"] - code_text_width(scrollbar_px=0)) <= 1.0, (p, rel)
    shots = os.environ.get("RH_DOCS_SCREENSHOTS")
    if shots:
        Path(shots).mkdir(parents=True, exist_ok=True)
        target = Path(shots) / f"{name.replace('/', '_')}.png"
        subprocess.run(
            [CHROMIUM, *_FLAGS, f"--screenshot={target}", page.as_uri()],
            capture_output=True,
            timeout=120,
            check=True,
        )


if __name__ == "__main__":  # pragma: no cover
    sys.exit(pytest.main([__file__]))
