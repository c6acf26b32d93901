"""The rank agent every engine plugin runs in its processes, whatever the engine: one process's session (its
roles' counters, exporter and reports: ``session.py``), the ``CAPWATCH_*`` settings (``settings.py``), the
kill switch (``switch.py``, standard library only) and the status series (``status.py``).

Engine-neutral: an engine's plugin (``sglang_plugin/``) passes in what its engine defines — the reported
limits, the status metric's name, the engine's own settings — so a second engine's plugin is a sibling package
that imports this one. Nothing here is imported before the plugin has read its kill switch but ``switch``.
"""
