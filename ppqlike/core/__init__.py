"""Layer 1: graph IR, quantization configs and numerics."""
