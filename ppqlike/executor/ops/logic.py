"""Kernels of the logic op family."""

KERNELS: dict = {}
