"""Figures and HTML/Markdown reports from runs, calibrations and validations, and the `commcal` front door
(cli). Never imports mpi4py."""
