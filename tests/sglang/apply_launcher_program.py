"""SGLang's launcher, as far as the cap goes: ``load_plugins()`` (capwatch through its entry point), the plan's
``ServerArgs`` and ``resolve_once()`` — SGLang's own resolution pipeline with its own start-up checks, where
``CAPWATCH_APPLY`` sets the cap — as ``Engine._launch_subprocesses`` does before it spawns the schedulers. Run by
the sglang venv's python with one release's folders first on ``PYTHONPATH``.

Writes to the run folder: ``server_args.pkl`` (the resolved record, pickled as SGLang hands it to its schedulers),
``launcher-env.json`` (this process's environment after resolution: what the schedulers inherit) and
``launcher.json`` (what it resolved — the memory fraction, the floor's terms by SGLang 0.5.22's own functions —
or SGLang's error). The plan's ``backend`` picks the server:
FlashInfer's (``rank_program.flashinfer_server_args``) or DeepEP's (``deepep_rank_program.deepep_server_args``).

    python -m tests.sglang.apply_launcher_program RUN_DIR
"""

from __future__ import annotations

import json
import logging
import os
import pickle
import sys
import time
from pathlib import Path


def main(run_dir: Path) -> None:
    logging.basicConfig(level=logging.INFO, format="[launcher] %(name)s %(levelname)s: %(message)s", force=True)
    from sglang.srt.plugins import load_plugins

    load_plugins()  # as launch_server / Engine.__init__ do, before ServerArgs exists
    from sglang.srt.server_args import ServerArgs

    from tests.sglang.deepep_rank_program import deepep_server_args
    from tests.sglang.rank_program import flashinfer_server_args

    plan = json.loads((run_dir / "plan.json").read_text())
    build = deepep_server_args if plan.get("backend") == "deepep" else flashinfer_server_args
    server_args = build(ServerArgs, plan)
    started = time.monotonic()
    outcome = {}
    try:
        server_args.resolve_once()
    except Exception as error:  # SGLang refused the server: what the launcher would print before exiting
        outcome["error"] = f"{type(error).__name__}: {error}"
    outcome["resolve_s"] = time.monotonic() - started
    if "error" not in outcome:
        from sglang.srt.arg_groups.model_override_base import resolved_view

        from sglang.srt.arg_groups import moe_hook

        from tests.sglang.rank_program import sglang_0_5_22_floor_terms

        outcome["mem_fraction_static"] = resolved_view(server_args).mem_fraction_static
        outcome["floor_terms"] = sglang_0_5_22_floor_terms(moe_hook, server_args)  # SGLang's own functions
        (run_dir / "server_args.pkl").write_bytes(pickle.dumps(server_args))
    (run_dir / "launcher-env.json").write_text(json.dumps(dict(os.environ)))
    (run_dir / "launcher.json").write_text(json.dumps(outcome))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
