"""CAPWATCH_APPLY: the launcher sets the cap from capwatch's advice inside SGLang's own resolution (docs/apply.md);
``applied.py`` hands what it set to the schedulers."""
