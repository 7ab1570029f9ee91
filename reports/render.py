"""Render a Document as one self-contained HTML page (PNG figures embedded) and as Markdown (figures beside it)."""

from __future__ import annotations

import base64
import html
import re
from pathlib import Path

from microbench.atomic import atomic_write_text
from reports.document import Document, FigureRef, Note, Table, Text

_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Helvetica,Arial,sans-serif;max-width:1100px;margin:2em auto;
padding:0 1em;color:#222;line-height:1.45}
h1{margin-bottom:.1em}.subtitle{color:#666;margin-top:0}
h2{border-bottom:2px solid #ddd;padding-bottom:.2em;margin-top:2em}
nav ul{columns:2;list-style:none;padding-left:0}
table{border-collapse:collapse;margin:.6em 0 1.2em;font-size:.92em}
th,td{border:1px solid #ccc;padding:.25em .6em;text-align:left;vertical-align:top;overflow-wrap:anywhere}
th{background:#f3f3f3}
caption{caption-side:top;text-align:left;font-weight:600;padding:.3em 0}
figure{margin:1em 0 2em}figure img{max-width:100%;border:1px solid #eee}
figcaption{color:#555;font-size:.9em}
.note{background:#eef4fb;border-left:4px solid #5b8fd6;padding:.4em .8em}
.warning{background:#fff6e5;border-left:4px solid #e0a030;padding:.4em .8em}
"""


_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")


def _printable(text: str) -> str:
    """Drop control characters (MPI banners end in NUL) that would make the page or the Markdown binary."""
    return _CONTROL.sub("", text)


def _esc(text: str) -> str:
    return html.escape(_printable(text))


def to_html(doc: Document, root: Path) -> str:
    """The page; `root` is the report directory the figures' relative paths start from."""
    esc = _esc
    out = ["<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
           f"<title>{esc(doc.title)}</title><style>{_CSS}</style></head><body>",
           f"<h1>{esc(doc.title)}</h1>", f'<p class="subtitle">{esc(doc.subtitle)}</p>',
           "<nav><ul>", *(f'<li><a href="#{s.key}">{esc(s.title)}</a></li>' for s in doc.sections), "</ul></nav>"]
    for section in doc.sections:
        out.append(f'<section id="{section.key}"><h2>{esc(section.title)}</h2>')
        out += [_html_block(b, root) for b in section.blocks]
        out.append("</section>")
    out.append("</body></html>")
    return "\n".join(out) + "\n"


def _html_block(block, root: Path) -> str:
    esc = _esc
    if isinstance(block, Text):
        return f"<p>{esc(block.text)}</p>"
    if isinstance(block, Note):
        return f'<p class="{block.kind}">{esc(block.text)}</p>'
    if isinstance(block, Table):
        head = "".join(f"<th>{esc(c)}</th>" for c in block.columns)
        body = "".join("<tr>" + "".join(f"<td>{esc(v)}</td>" for v in row) + "</tr>" for row in block.rows)
        table = f"<table><caption>{esc(block.title)}</caption><tr>{head}</tr>{body}</table>"
        if block.folded:
            return f"<details><summary>{esc(block.title)} ({len(block.rows)} rows)</summary>{table}</details>"
        return table
    if isinstance(block, FigureRef):
        data = base64.b64encode((root / block.png).read_bytes()).decode("ascii")
        svg = f' (<a href="{esc(block.svg.as_posix())}">SVG</a>)' if block.svg else ""
        return (f'<figure><img alt="{esc(block.title)}" src="data:image/png;base64,{data}">'
                f"<figcaption><b>{esc(block.title)}.</b> {esc(block.caption)}{svg}</figcaption></figure>")
    raise TypeError(f"unknown block {block!r}")


def to_markdown(doc: Document) -> str:
    out = [f"# {doc.title}", "", f"_{doc.subtitle}_", ""]
    out += [f"- [{s.title}](#{s.key})" for s in doc.sections]
    for section in doc.sections:
        out += ["", f'<a id="{section.key}"></a>', f"## {section.title}", ""]
        for block in section.blocks:
            out += [_md_block(block), ""]
    return "\n".join(out).rstrip() + "\n"


def _md_cell(value: str) -> str:
    return _printable(value).replace("|", "\\|").replace("\n", " ")


def _md_block(block) -> str:
    if isinstance(block, Text):
        return _printable(block.text)
    if isinstance(block, Note):
        return f"> **{block.kind.capitalize()}:** {_printable(block.text)}"
    if isinstance(block, Table):
        lines = [f"**{block.title}**", "", "| " + " | ".join(map(_md_cell, block.columns)) + " |",
                 "|" + "|".join(["---"] * len(block.columns)) + "|"]
        lines += ["| " + " | ".join(map(_md_cell, row)) + " |" for row in block.rows]
        return "\n".join(lines)
    if isinstance(block, FigureRef):
        svg = f" ([SVG]({block.svg.as_posix()}))" if block.svg else ""
        return f"![{block.title}]({block.png.as_posix()})\n\n*{block.title}.* {block.caption}{svg}"
    raise TypeError(f"unknown block {block!r}")


def write_pages(doc: Document, out: Path, names: tuple[str, str]) -> tuple[Path, Path]:
    """out/names[0] (HTML, figures embedded) and out/names[1] (Markdown, figures beside it), each written
    atomically."""
    html_path, md_path = out / names[0], out / names[1]
    atomic_write_text(html_path, to_html(doc, out))
    atomic_write_text(md_path, to_markdown(doc))
    return html_path, md_path
