"""PPQ's ``ppq.quantization`` path: ``ppqlike.quantization.optim`` holds PPQ's pass class names."""
