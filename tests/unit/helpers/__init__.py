"""Tests of the tools around the package, not of ``slm_server``: the test suite's own
helpers (``tests/processes.py``, ``tests/models/``) and the benchmark tools
(``benchmarks/``)."""
