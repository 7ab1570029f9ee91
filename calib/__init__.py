"""Fitting alpha-beta models and the calibration file. Never imports mpi4py."""
