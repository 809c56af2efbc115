"""Training from feedback snapshots, evaluation, ONNX export and registry release."""
