"""Figures and HTML/Markdown reports from runs, calibrations and validations. Never imports mpi4py."""
