"""The test suites. Importing ``tests`` guards the process: each module of the checkout has one import name,
``capwatch.X`` as in an install (``tests/support/one_name.py``)."""

from tests.support import one_name

one_name.install()
