"""Stream processing: topic management, the synthetic event producer, validating consumers and (later) PyFlink jobs."""
