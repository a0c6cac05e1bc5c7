"""Kernels of the conv op family."""

KERNELS: dict = {}
