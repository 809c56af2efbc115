"""The Feast feature repository and the online read path (arrives with the streaming-features issue)."""
