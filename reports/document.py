"""The report as data: sections of text, notes, tables and figures, rendered to HTML and Markdown."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Text:
    text: str


@dataclass(frozen=True)
class Note:
    """Something the reader should know about what is (not) in the report; kind 'note' or 'warning'."""

    text: str
    kind: str = "note"


@dataclass(frozen=True)
class Table:
    title: str
    columns: tuple[str, ...]
    rows: tuple[tuple[str, ...], ...]
    folded: bool = False        # long reference material: HTML shows it behind its title


@dataclass(frozen=True)
class FigureRef:
    """A saved figure: PNG (and SVG) paths relative to the report directory."""

    title: str
    caption: str
    png: Path
    svg: Path | None = None


Block = Text | Note | Table | FigureRef


@dataclass(frozen=True)
class Section:
    key: str
    title: str
    blocks: tuple[Block, ...]


@dataclass(frozen=True)
class Document:
    title: str
    subtitle: str
    sections: tuple[Section, ...]
