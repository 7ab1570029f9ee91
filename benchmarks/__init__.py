"""Benchmarks that print figures against the project's speed and accuracy targets, run from a checkout (not
installed): `python -m benchmarks.validate` (ranking accuracy of a calibration on a real machine),
`benchmarks.fit` (fit time, memory and held-out error), `benchmarks.search` (strategy search speed),
`benchmarks.overhead` (sweep timing against a plain C loop, under mpirun) and `benchmarks.gpu` (a GPU node).
They sit above every package and use them as a user would; nothing imports them but tests."""

import argparse


def benchmark_parser(module: str, doc: str) -> argparse.ArgumentParser:
    """A benchmark's argument parser, named as it is run (`python -m benchmarks.X`) and described by its docstring's
    first paragraph."""
    first = " ".join(doc.split("\n\n")[0].split())
    return argparse.ArgumentParser(prog=f"python -m {module}", description=first)
