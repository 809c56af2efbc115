"""Stream processing: Kafka topics from their specs, the synthetic event producer, validating consumers and topic
readers, and the PyFlink feature job compiled from the Feast stream feature views (its JVM operators, Kafka tables,
checkpoints, embedded or submitted to a Flink cluster) with the offline recompute of the same windows."""
