"""Kernels of the pooling op family."""

KERNELS: dict = {}
