"""SGLang's own logging, for the log reader's tests: run by the sglang venv's python.

For each case of the plan: real ``ServerArgs`` (a tiny local model, nothing downloaded), published as a
scheduler does, then logged the way SGLang logs it — ``configure_logger`` (``utils/common.py``: SGLang's own
format and stamp, ``SGLANG_LOG_MS``) with the scheduler's prefix, the start-up line as ``entrypoints/engine.py``
writes it (``server_args={_server_args_for_logging(server_args)}``), then decode lines (their message from
the test's template, tests/support/sglang_logs.py). Prints, per case, what SGLang itself says sizes the cap:
its floor inputs (read with SGLang's functions, ``sglang_plugin/floors/flashinfer.py``) and its default cap
(``arg_groups/overrides.py``).

    python -m tests.sglang.log_program PLAN_JSON OUT_DIR
"""

from __future__ import annotations

import json
import logging
import os
import sys
from pathlib import Path


def main(plan_path: Path, out_dir: Path) -> None:
    from capwatch.sglang_plugin.floors.flashinfer import limits as flashinfer_limits
    from sglang.srt.arg_groups import moe_hook, overrides
    from sglang.srt.runtime_context import SpawnRanks, publish
    from sglang.srt.sampling.watermarking.core import redact_watermark_secrets
    from sglang.srt.server_args import ServerArgs
    from sglang.srt.utils.common import configure_logger

    from tests.support import sglang_logs as sg

    plan = json.loads(plan_path.read_text())
    results = {}
    for name, case in plan["cases"].items():
        os.environ.update(case.get("env", {}))
        server_args = ServerArgs(model_path=plan["model_dir"], skip_tokenizer_init=True, device="cpu",
                                 moe_a2a_backend="flashinfer", moe_runner_backend="flashinfer_cutlass",
                                 **case["server_args"])
        publish(server_args, role="scheduler", ranks=SpawnRanks(world_rank=0, dp_rank=None, gpu_id=0))
        limits = flashinfer_limits(server_args, None, "0.5.23")
        default_cap = overrides.flashinfer_a2a_max_dispatch_tokens_per_rank(moe_hook.max_prefill_buffer_tokens(
            server_args))
        log = out_dir / f"{name}.log"
        handler = logging.FileHandler(log)
        configure_logger(server_args, prefix=case.get("prefix", ""))
        root = logging.getLogger()
        handler.setFormatter(root.handlers[0].formatter)  # SGLang's own format, into a file
        root.handlers = [handler]
        # entrypoints/engine.py (importing it needs uvloop, which this venv lacks): _server_args_for_logging
        logging.getLogger("sglang.srt.entrypoints.engine").info(
            f"server_args={redact_watermark_secrets(server_args.resolved_dict())}")
        for at, running in case["decode"]:
            logging.getLogger("sglang.srt.managers.scheduler").info(sg.decode_message(running))
        handler.close()
        root.handlers = [logging.NullHandler()]  # the next case's start-up chatter goes nowhere
        results[name] = {"limits": limits.model_dump(), "default_cap": default_cap, "tp_size": server_args.tp_size,
                         "ep_size": server_args.ep_size}
    print(json.dumps(results))


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
