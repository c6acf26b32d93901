"""Where the launcher's advice comes from: ``CAPWATCH_ADVICE_FILE`` (what ``capwatch advise --json`` prints and
``GET /v1/clusters/{cluster}/advice`` answers: one object, a list of them, or one a line), else the service at
``CAPWATCH_SERVICE_URL`` for ``CAPWATCH_CLUSTER``, waited for at most ``CAPWATCH_APPLY_WAIT_S`` (2 s): a service
that does not answer in time never holds up the server's start.

The advice's revision is its generation time in whole seconds (``generated_unix_s``): every node given the same
file applies the same revision, and a later revision is newer advice.
"""

from __future__ import annotations

import json
import threading
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

from capwatch.advisor.advice import ClusterAdvice
from pydantic import ValidationError

ROLE = "target"  # the server's model (a draft model's dispatchers read the same variable, sized by the target's)
MAX_ADVICE_BYTES = 4 << 20


class AdviceUnavailable(Exception):
    """No advice to apply; the message says why, in words for the one log line."""


def revision(advice: ClusterAdvice) -> int:
    return int(advice.generated_unix_s)


def _objects(text: str, where: str) -> list[dict]:
    try:
        found = json.loads(text)
    except json.JSONDecodeError:
        try:  # one object a line (capwatch advise --format json over several groups)
            found = [json.loads(line) for line in text.splitlines() if line.strip()]
        except json.JSONDecodeError as error:
            raise AdviceUnavailable(f"{where} is not JSON ({error.msg} at line {error.lineno})") from None
    found = found if isinstance(found, list) else [found]
    if not all(isinstance(item, dict) for item in found):
        raise AdviceUnavailable(f"{where} holds something other than advice objects")
    return found


def pick(objects: list[dict], cluster: str, where: str) -> ClusterAdvice:
    """The one advice for ``cluster``'s target model among ``objects``."""
    mine = [item for item in objects if item.get("cluster") == cluster and item.get("role", ROLE) == ROLE]
    if not mine:
        named = sorted({str(item.get("cluster")) for item in objects})
        raise AdviceUnavailable(f"{where} has no advice for cluster {cluster!r} (CAPWATCH_CLUSTER); it has "
                                f"{', '.join(named) or 'none'}")
    if len(mine) > 1:
        raise AdviceUnavailable(f"{where} has {len(mine)} advices for cluster {cluster!r}: which one applies is "
                                "not known")
    try:
        return ClusterAdvice.model_validate(mine[0])
    except ValidationError as error:
        first = error.errors()[0]
        raise AdviceUnavailable(f"{where}: its advice for {cluster!r} is not capwatch advice "
                                f"({'.'.join(map(str, first['loc']))}: {first['msg']})") from None


def from_file(path: Path, cluster: str) -> ClusterAdvice:
    where = f"CAPWATCH_ADVICE_FILE {path}"
    try:
        with open(path, "rb") as handle:
            data = handle.read(MAX_ADVICE_BYTES + 1)
    except OSError as error:
        raise AdviceUnavailable(f"{where} cannot be read ({error.strerror or error})") from None
    if len(data) > MAX_ADVICE_BYTES:
        raise AdviceUnavailable(f"{where} is larger than {MAX_ADVICE_BYTES >> 20} MiB: not an advice file")
    return pick(_objects(data.decode("utf-8", errors="replace"), where), cluster, where)


def from_service(url: str, cluster: str, token: str | None, wait_s: float) -> ClusterAdvice:
    """The service's advice, or AdviceUnavailable once ``wait_s`` has passed (the request is left to a daemon
    thread: nothing it does afterwards reaches the server)."""
    address = f"{url.rstrip('/')}/v1/clusters/{urllib.parse.quote(cluster, safe='')}/advice?role={ROLE}"
    where = f"the service at {url}"
    answer: dict = {}

    def fetch() -> None:
        request = urllib.request.Request(address, headers={"Accept": "application/json"})
        if token:
            request.add_header("Authorization", f"Bearer {token}")
        try:
            with urllib.request.urlopen(request, timeout=wait_s) as response:
                answer["text"] = response.read(MAX_ADVICE_BYTES + 1).decode("utf-8", errors="replace")
        except urllib.error.HTTPError as error:
            detail = error.read(2000).decode("utf-8", errors="replace")
            try:
                detail = json.loads(detail).get("detail", detail)
            except (ValueError, AttributeError):
                pass
            answer["error"] = f"{where} answered {error.code} ({str(detail)[:200]})"
        except (OSError, ValueError) as error:  # URLError, timeouts, resets
            reason = getattr(error, "reason", None) or error
            answer["error"] = (f"{where} did not answer within {wait_s:g} s" if isinstance(reason, TimeoutError)
                               else f"{where} is unreachable ({reason})")

    worker = threading.Thread(target=fetch, name="capwatch-advice", daemon=True)
    worker.start()
    worker.join(wait_s)
    if worker.is_alive() or not answer:
        raise AdviceUnavailable(f"{where} did not answer within {wait_s:g} s")
    if "error" in answer:
        raise AdviceUnavailable(answer["error"])
    return pick(_objects(answer["text"], where), cluster, where)
