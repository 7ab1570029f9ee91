"""Shared matplotlib plumbing: Agg-only figures (no pyplot state), readable byte axes, atomic PNG/SVG saving."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")

from matplotlib.figure import Figure  # noqa: E402
from matplotlib.ticker import FuncFormatter, LogFormatter, LogLocator  # noqa: E402

from microbench.atomic import atomic_write  # noqa: E402
from microbench.sizes import format_size  # noqa: E402
from reports.document import FigureRef  # noqa: E402
from reports.output import FIGURES  # noqa: E402

COLORS = matplotlib.colormaps["tab10"].colors
US = 1e6
"""Seconds to microseconds, the unit of every time axis."""
GB = 1e9
"""Bytes per second to GB/s (decimal, as nccl-tests reports)."""


def new_figure(width: float, height: float, ncols: int = 1, nrows: int = 1) -> tuple[Figure, list]:
    fig = Figure(figsize=(width, height), layout="constrained")
    axes = fig.subplots(nrows, ncols, squeeze=False).ravel().tolist()
    for ax in axes:
        ax.grid(True, which="major", alpha=0.35)
    return fig, axes


def bytes_axis(ax, label: str = "message size (bytes)") -> None:
    """Log2 x axis with ticks printed as 8, 1K, 64M."""
    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_locator(LogLocator(base=4))
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: format_size(v) if v >= 1 else f"{v:g}"))
    ax.set_xlabel(label)


def log_values(axis) -> None:
    """Log scale on one axis (ax.xaxis, ax.yaxis, a colorbar's) labelled in plain numbers (0.01, 2, 100), minor
    ticks too when it spans under two decades; plain text also spares matplotlib its slow mathtext parser."""
    if axis.axis_name == "x":
        axis.axes.set_xscale("log")
    else:
        axis.axes.set_yscale("log")
    axis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    axis.set_minor_formatter(LogFormatter(labelOnlyBase=False, minor_thresholds=(2, 0.5)))


def save_figure(fig: Figure, root: Path, name: str, title: str, caption: str, svg: bool = True) -> FigureRef:
    """Write figures/NAME.png (and .svg) under the report directory `root`, each atomically."""
    fig.draw_without_rendering()   # lay out once (the costly part), then draw each format with that layout
    fig.set_layout_engine(None)
    rel_png = Path(FIGURES) / f"{name}.png"
    atomic_write(root / rel_png, lambda tmp: fig.savefig(tmp, format="png", dpi=110))
    rel_svg = None
    if svg:
        rel_svg = Path(FIGURES) / f"{name}.svg"
        atomic_write(root / rel_svg, lambda tmp: fig.savefig(tmp, format="svg"))
    return FigureRef(title, caption, rel_png, rel_svg)
