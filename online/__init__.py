"""The online scorer: feature fetch within a budget (defaults on a miss), dynamic batching, model runtimes (ONNX
Runtime, vLLM), the HTTP, gRPC and Kafka front doors, the feature + prediction log, metrics, a result cache, and hot
swap to the versions the model registry names."""
