"""The online scorer: feature fetch, dynamic batching, model runtimes, front doors (arrives with the inference issue)."""
