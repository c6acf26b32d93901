"""The A2A backends capwatch knows, one ``BackendSpec`` each (``backends/<name>.py``), registered here once.

Every shared part — the report schema, the collector, the sources, the advisor's pricing, ``plan``, the log
reader — loops over ``SPECS`` or looks a rank's backend up with ``spec_of``; adding a backend is a module here
and its line below (docs/sizing.md, "Adding a backend")."""

from __future__ import annotations

from dataclasses import replace

from capwatch.backends import deepep, deepep_v2, flashinfer, flashinfer_megamoe, megamoe, mooncake, mori, nixl, pplx
from capwatch.backends.spec import BackendSpec, Pricing
from capwatch.engines import ENGINE
from capwatch.sizing.checks import SizingError

# Each spec with the engine's side of its cap (its variable, default and reserve: capwatch.engines) in its rules.
SPECS: dict[str, BackendSpec] = {module.SPEC.name: replace(module.SPEC, rules=ENGINE.bind_rules(module.SPEC.rules))
                                 for module in (flashinfer, deepep, deepep_v2, mooncake, mori, nixl, pplx,
                                                flashinfer_megamoe, megamoe)}
BACKEND_NAMES: tuple[str, ...] = tuple(SPECS)
DEFAULT_BACKEND: BackendSpec = next(iter(SPECS.values()))  # what a config that names none runs (the wire's first)
# The wire's bounds on a rank's geometry: the largest any backend's ranks can report.
MAX_TOP_K: int = max(spec.max_top_k for spec in SPECS.values() if spec.max_top_k is not None)
MAX_EP_SIZE: int = max(spec.max_ep_size for spec in SPECS.values() if spec.max_ep_size is not None)


def spec_of(name: str) -> BackendSpec:
    """The spec of the backend SGLang calls ``name``; SizingError naming the known ones otherwise."""
    spec = SPECS.get(name)
    if spec is None:
        raise SizingError(f"capwatch does not size the {name!r} A2A backend; it knows {', '.join(sorted(SPECS))}")
    return spec


def nest_params(data: dict) -> dict:
    """A rank config's fields (a JSON body, rank_config's keywords) with each backend's parameters under its name:
    those of a backend whose parameters were once the config's own fields (``params_formerly_top_level``) are
    moved there from the top level, where reports stored before and older plugins still send them; on another
    backend's rank they are dropped when they say that backend's defaults (older bodies carry them everywhere)
    and refused otherwise. The rank's backend, where its parameters all have defaults, gets them when the body
    gives none. ValueError saying what is wrong; ``data`` itself is left as it is."""
    backend = data.get("a2a_backend", DEFAULT_BACKEND.name)
    for spec in SPECS.values():
        if spec.params is None or not spec.params_formerly_top_level:
            continue
        fields = spec.params.model_fields
        legacy = {name: data[name] for name in fields if name in data}
        if legacy:
            data = {name: value for name, value in data.items() if name not in legacy}
            if backend == spec.name:
                if data.get(spec.name) is not None:
                    raise ValueError(f"{', '.join(legacy)} given both at the top level and under {spec.name!r}: "
                                     f"give them once, under {spec.name!r}")
                data[spec.name] = legacy
            elif any(value != fields[name].default for name, value in legacy.items()):
                raise ValueError(f"{', '.join(legacy)} are the {spec.name} backend's parameters, not a {backend} "
                                 f"rank's: leave them out (or at their defaults)")
        if backend == spec.name and data.get(spec.name) is None:
            data = {**data, spec.name: {}}  # every field has its default
    return data


def pricing_of(config, ep_size: int) -> Pricing:
    """The pricing of a rank's config (a ``RankConfig``, or a source's ``UnpricedConfig``) in a group of
    ``ep_size`` ranks, by its backend."""
    return spec_of(config.a2a_backend).pricing(config, ep_size)


__all__ = ["BACKEND_NAMES", "DEFAULT_BACKEND", "MAX_EP_SIZE", "MAX_TOP_K", "SPECS", "BackendSpec", "Pricing", "nest_params",
           "pricing_of", "spec_of"]
