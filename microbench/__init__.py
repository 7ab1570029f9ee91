"""Measuring: sweeps of MPI/NCCL collectives. Only the driver and sweep modules import mpi4py."""
