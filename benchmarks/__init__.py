"""Benchmarks that print figures against the project's speed and accuracy targets, run from a checkout (not
installed): `python -m benchmarks.validate` (ranking accuracy of a calibration on a real machine),
`benchmarks.fit` (fit time, memory and held-out error), `benchmarks.search` (strategy search speed),
`benchmarks.overhead` (sweep timing against a plain C loop, under mpirun) and `benchmarks.gpu` (a GPU node).
They sit above every package and use them as a user would; nothing imports them but tests."""
