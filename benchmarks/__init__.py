"""The benchmarks, run from the checkout (``python -m benchmarks NAME``). Importing ``tests`` guards the process as
in the test run: each module of the checkout has one import name, ``capwatch.X`` (tests/support/one_name.py)."""

import tests  # noqa: F401
