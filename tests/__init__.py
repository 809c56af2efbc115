"""Loopline's tests: one folder per code package; helpers in ``tests/support``, fixtures in each folder's conftest.py."""
