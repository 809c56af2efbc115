"""Helpers the tests import by name (``from support.kafka_log import LogReader``): the one importable place under
``tests/`` (pyproject's pytest ``pythonpath``). Fixtures live in the ``conftest.py`` of the folder that uses them."""
