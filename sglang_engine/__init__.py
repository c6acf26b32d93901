"""What SGLang defines, in one torch-free package: the wire's limits of an SGLang rank (``limits.py``), the
start-up floor those limits set (``floor.py``) and its terms, derived once from the facts a server resolved
(``floor_terms.py``), whether read from a live server (``sglang_plugin/``) or from its log (``sglang_logs/``); its
memory reserve in the advice (``memory.py``) and the server the Kubernetes example runs (``deployment.py``); each
backend's cap variable, default, reserve and SGLang's words for it (``caps.py``), and SGLang's own code for a
backend where it has some (``deepep.py``, ``flashinfer.py``: how SGLang allocates it, what it asserts), which
``caps.bind`` hands the backend's spec as ``rules.engine_side``.

Below the telemetry and the advisor, above ``sizing/``: the rest of capwatch reads SGLang's facts from here.
"""
