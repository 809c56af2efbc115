"""Loopline's local stack: a real Kafka broker (KRaft), Redis, Prometheus with the alert rules, the Flink runtime +
connector (and a standalone Flink session cluster), the skew dashboard's server and the Grafana dashboard.

Services are started as child processes detached from the caller, each with a pid file, a
log file and a data directory, so that the stack outlives the command that started it.
This package imports nothing else of Loopline's; it takes every path, port and limit as an argument.
"""
