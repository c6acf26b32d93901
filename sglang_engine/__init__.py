"""What SGLang defines, in one torch-free package: the wire's limits of an SGLang rank (``limits.py``), the
start-up floor those limits set (``floor.py``) and its terms, derived once from the facts a server resolved
(``floor_terms.py``), whether read from a live server (``sglang_plugin/``) or from its log (``sglang_logs/``); its
memory reserve in the advice (``memory.py``) and the server the Kubernetes example runs (``deployment.py``); each
backend's cap variable, default, reserve and SGLang's words for it (``caps.py``), and SGLang's own code for a
backend where it has some (``deepep.py``, ``flashinfer.py``: how SGLang allocates it, what it asserts), which
``caps.bind`` puts in the backend's rules as ``engine_side`` (the spec states what it calls there as a Protocol:
``backends/deepep.py`` ``DeepEPEngineSide``).

Just above ``sizing/``, below ``capwatch.engines`` (the registry that names it) and everything else: the rest of
capwatch reads SGLang's facts through that registry.
"""
