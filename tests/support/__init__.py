"""What the test suites share: the checkout and the one-name guard (``checkout``, ``one_name``), the one way to
start a child Python (``launcher``), the real service (``service``), Chromium, Prometheus, free ports, simulated
ranks and SGLang log lines."""
