"""Kernels of the linear op family."""

KERNELS: dict = {}
