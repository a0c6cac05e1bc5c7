"""Kernels of the arithmetic op family."""

KERNELS: dict = {}
