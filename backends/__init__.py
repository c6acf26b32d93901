"""The A2A backends capwatch knows, one ``BackendSpec`` each (``backends/<name>.py``), registered here once.

Every shared part — the report schema, the collector, the sources, the advisor's pricing, ``plan``, the log
reader — loops over ``SPECS`` or looks a rank's backend up with ``spec_of``; adding a backend is a module here
and its line below (docs/sizing.md, "Adding a backend")."""

from __future__ import annotations

from dataclasses import replace

from capwatch.backends import deepep, deepep_v2, flashinfer
from capwatch.backends.spec import BackendSpec, Pricing
from capwatch.engines import ENGINE
from capwatch.sizing.checks import SizingError

# Each spec with the engine's side of its cap (its variable, default and reserve: capwatch.engines) in its rules.
SPECS: dict[str, BackendSpec] = {module.SPEC.name: replace(module.SPEC, rules=ENGINE.bind_rules(module.SPEC.rules))
                                 for module in (flashinfer, deepep, deepep_v2)}
BACKEND_NAMES: tuple[str, ...] = tuple(SPECS)
DEFAULT_BACKEND: BackendSpec = next(iter(SPECS.values()))  # what a config that names none runs (the wire's first)


def spec_of(name: str) -> BackendSpec:
    """The spec of the backend SGLang calls ``name``; SizingError naming the known ones otherwise."""
    spec = SPECS.get(name)
    if spec is None:
        raise SizingError(f"capwatch does not size the {name!r} A2A backend; it knows {', '.join(sorted(SPECS))}")
    return spec


def pricing_of(config, ep_size: int) -> Pricing:
    """The pricing of a rank's config (a ``RankConfig``, or a source's ``UnpricedConfig``) in a group of
    ``ep_size`` ranks, by its backend."""
    return spec_of(config.a2a_backend).pricing(config, ep_size)


__all__ = ["BACKEND_NAMES", "DEFAULT_BACKEND", "SPECS", "BackendSpec", "Pricing", "pricing_of", "spec_of"]
