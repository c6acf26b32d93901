"""The command line's client of a running capwatch service (its HTTP API): the connection, with the token from
``CAPWATCH_TOKEN``, one line for what went wrong, and the advice of one group or all. Used by ``capwatch advise``
and by the demo, which reads the advice its embedded service gives."""

from __future__ import annotations

import os

from capwatch.usage_errors import CommandError


def service_error(base: str, error: Exception) -> Exception:
    """One line for what went wrong talking to the service: unreachable, or an unexpected answer."""
    import httpx

    if isinstance(error, httpx.HTTPStatusError):
        return CommandError(f"the service at {base} answered {error.response.status_code}: "
                            f"{error.response.text[:200]}")
    return CommandError(f"cannot reach the capwatch service at {base} ({error}); start it with "
                        "`capwatch serve` or pass --url")


def service_client(url: str, timeout: float):
    """An httpx client for the service at ``url``, with the bearer token from ``CAPWATCH_TOKEN`` when it is set
    (a service with CAPWATCH_READS_NEED_TOKEN needs it on reads)."""
    import httpx

    from capwatch.telemetry.endpoint import bearer_token_problem, http_url_problem

    base = url.rstrip("/")
    problem = http_url_problem(base)
    if problem is not None:
        raise CommandError(f"--url {url[:200]!r}: {problem}")
    token = os.environ.get("CAPWATCH_TOKEN") or None
    if token is not None and bearer_token_problem(token) is not None:
        raise CommandError(f"CAPWATCH_TOKEN: {bearer_token_problem(token)}")
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return httpx.Client(base_url=base, timeout=timeout, headers=headers)


def response_detail(response) -> str:
    try:
        return str(response.json().get("detail", response.text))[:300]
    except ValueError:
        return response.text[:300]


def fetch_advice(url: str, cluster: str | None, role: str, timeout: float) -> list[dict]:
    """The advice of one cluster, or of every cluster with ranks of ``role``: a cluster that cannot be advised is
    an entry with its ``error``, one without such ranks an entry that says so (``skipped``); neither stops the
    others."""
    import httpx

    base = url.rstrip("/")
    try:
        with service_client(url, timeout) as client:
            if cluster is not None:
                response = client.get(f"/v1/clusters/{cluster}/advice", params={"role": role})
                if response.status_code in (404, 409):  # unknown cluster or role; a group that cannot be advised
                    raise CommandError(response_detail(response))
                if response.status_code == 422:
                    raise CommandError(f"{cluster!r} is not a valid cluster name (letters, digits, _ . : -)")
                response.raise_for_status()
                return [response.json()]
            listing = client.get("/v1/clusters")
            listing.raise_for_status()
            summaries = listing.json()
            if not summaries:
                raise CommandError(f"the service at {base} knows no cluster yet: no rank has reported")
            results = []
            for summary in summaries:
                name, roles = summary["cluster"], summary.get("roles", [])
                if role not in roles:  # nothing to advise for this role: said, not an error
                    results.append({"cluster": name, "role": role,
                                    "skipped": f"no {role!r} ranks (roles: {', '.join(roles)})"})
                    continue
                response = client.get(f"/v1/clusters/{name}/advice", params={"role": role})
                if response.status_code in (404, 409):  # gone since the listing; cannot be advised
                    results.append({"cluster": name, "role": role, "error": response_detail(response)})
                    continue
                response.raise_for_status()
                results.append(response.json())
            if all("skipped" in result for result in results):
                raise CommandError(f"no cluster has {role!r} ranks (clusters: "
                                   f"{', '.join(result['cluster'] for result in results)[:300]})")
            return results
    except httpx.HTTPError as error:
        raise service_error(base, error) from None
