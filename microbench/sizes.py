"""Parsing and printing byte sizes: '8:64M' (powers of two between bounds), '8,1K,3M', or both mixed."""

from __future__ import annotations

import re

from microbench.errors import UsageError
from microbench.limits import MAX_BYTES

_UNITS = {"": 1, "B": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]?)(?:I?B)?\s*$", re.IGNORECASE)


def parse_size(text: str) -> int:
    """'64M' -> 67108864. Binary units (K = 1024). Raises UsageError on anything else."""
    m = _SIZE_RE.match(text)
    if not m:
        raise UsageError(f"malformed size {text!r}: expected a number with an optional K/M/G/T suffix")
    value = float(m.group(1)) * _UNITS[m.group(2).upper()]
    if not 0 < value <= MAX_BYTES or value != int(value):
        raise UsageError(f"size {text!r} must be a positive whole number of bytes, at most {MAX_BYTES}")
    return int(value)


def parse_sizes(text: str) -> list[int]:
    """A comma-separated list of sizes and LOW:HIGH ranges (every power of two between the bounds), sorted and
    unique: '8:64M', '8,1K,3M', '8:64M,1448,2896'."""
    text = text.strip()
    if not text:
        raise UsageError("empty size list")
    sizes: set[int] = set()
    for part in text.split(","):
        if not part.strip():
            raise UsageError(f"malformed size list {text!r}")
        sizes.update(_power_range(part) if ":" in part else (parse_size(part),))
    return sorted(sizes)


def _power_range(text: str) -> list[int]:
    """'8:64M' -> every power of two from 8 to 64 MiB."""
    parts = text.split(":")
    if len(parts) != 2 or not all(part.strip() for part in parts):
        raise UsageError(f"malformed size range {text!r}: expected LOW:HIGH, e.g. 8:64M")
    low, high = parse_size(parts[0]), parse_size(parts[1])
    if low > high:
        raise UsageError(f"size range {text!r} is empty: {low} > {high}")
    sizes, s = [], 1 << (low - 1).bit_length()
    while s <= high:
        sizes.append(s)
        s <<= 1
    if not sizes:
        raise UsageError(f"size range {text!r} holds no power of two")
    return sizes


def format_size(n: float) -> str:
    """67108864 -> '64M'; 1536 -> '1.5K'. Short, for tables and file names."""
    for unit in ("T", "G", "M", "K"):
        scale = _UNITS[unit]
        if n >= scale:
            v = n / scale
            return f"{v:.0f}{unit}" if v == int(v) else f"{v:.4g}{unit}"
    return f"{int(n)}"
