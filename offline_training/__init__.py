"""Training from feedback snapshots, evaluation, ONNX export and release through the model registry."""
