"""Scenarios that run the whole system, each over the parts the rest of ``loopline/`` wires: the demo (``make demo``,
``demo.py`` with its scoring, loop and skew halves), the fault drill (``fault_drill.py``, kill -9 under load) and the
GPU check (``gpu_check.py``, ``infra/gpu_check.sh``)."""
