"""Training from feedback snapshots (torch, DeepSpeed), evaluation against prod, model cards, ONNX export and INT8,
GPU sizing, and release through the model registry (the canary policy and its controller)."""
