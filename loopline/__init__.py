"""Loopline's composition root: the one place that reads settings and wires the components."""
