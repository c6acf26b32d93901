"""SGLang's own logging, for the log reader's tests: run by the sglang venv's python, with one release's
folder (``tests/sglang/releases.py``) first on ``PYTHONPATH`` (the plan names it).

For each case of the plan: real ``ServerArgs`` (a tiny local model, nothing downloaded), published as a
scheduler does, then logged the way SGLang logs it — ``configure_logger`` (``utils/common.py``: SGLang's own
format and stamp, ``SGLANG_LOG_MS``) with the scheduler's prefix, the start-up line as ``entrypoints/engine.py``
writes it (``server_args={server_args.resolved_dict()}``; from 0.5.22 through ``_server_args_for_logging``,
which redacts the watermark secrets), then decode lines (their message from the test's template,
tests/support/sglang_logs.py). Prints, per case, what SGLang itself says sizes the cap: its floor inputs as
the plugin reads them on that release (the case's backend's floor module: FlashInfer's SGLang's functions from
0.5.22, capwatch's rule before; pplx's its start-up check) and its default cap (FlashInfer's 0.5.22 on:
``arg_groups/overrides.py``; before, the expression in ``FlashinferDispatcher.__init__``; pplx's its variable's).

    python -m tests.sglang.log_program PLAN_JSON OUT_DIR
"""

from __future__ import annotations

import json
import logging
import os
import sys
from pathlib import Path


# What each backend's server needs beside --moe-a2a-backend (the runner SGLang accepts with it; pplx as
# tests/sglang/pplx_rank_program.py starts it).
BACKEND_ARGS = {
    "flashinfer": {"moe_runner_backend": "flashinfer_cutlass"},
    "pplx": {"moe_runner_backend": "deep_gemm", "deepep_mode": "low_latency", "deepep_dispatcher_output_dtype": "bf16"},
}


def main(plan_path: Path, out_dir: Path) -> None:
    from capwatch.sglang_plugin.hooks import BACKENDS
    from sglang.srt.server_args import ServerArgs
    from sglang.srt.utils.common import configure_logger

    from tests.sglang.rank_program import publish_scheduler
    from tests.support import sglang_logs as sg

    plan = json.loads(plan_path.read_text())
    release = plan["release"]
    results = {}
    for name, case in plan["cases"].items():
        os.environ.update(case.get("env", {}))
        backend = case.get("backend", "flashinfer")
        server_args = ServerArgs(model_path=plan["model_dir"], skip_tokenizer_init=True, device="cpu",
                                 moe_a2a_backend=backend, **{**BACKEND_ARGS[backend], **case["server_args"]})
        publish_scheduler(server_args, 0)
        limits = BACKENDS[backend].FLOOR.limits(server_args, None, release)  # as the plugin reads them
        log = out_dir / f"{name}.log"
        handler = logging.FileHandler(log)
        configure_logger(server_args, prefix=case.get("prefix", ""))
        root = logging.getLogger()
        handler.setFormatter(root.handlers[0].formatter)  # SGLang's own format, into a file
        root.handlers = [handler]
        # entrypoints/engine.py (importing it needs uvloop, which this venv lacks)
        logging.getLogger("sglang.srt.entrypoints.engine").info(f"server_args={_for_logging(server_args)}")
        for at, running in case["decode"]:
            logging.getLogger("sglang.srt.managers.scheduler").info(sg.decode_message(running))
        handler.close()
        root.handlers = [logging.NullHandler()]  # the next case's start-up chatter goes nowhere
        results[name] = {"limits": limits.model_dump(), "default_cap": _default_cap(server_args, backend),
                         "tp_size": server_args.tp_size, "ep_size": server_args.ep_size}
    print(json.dumps(results))


def _for_logging(server_args) -> dict:
    """What ``entrypoints/engine.py`` logs: 0.5.22 on, ``_server_args_for_logging`` (the resolved dict with the
    watermark secrets redacted); 0.5.19 - 0.5.21, which have no watermarking, ``resolved_dict()`` itself."""
    try:
        from sglang.srt.sampling.watermarking.core import redact_watermark_secrets
    except ImportError:
        return server_args.resolved_dict()
    return redact_watermark_secrets(server_args.resolved_dict())


def _default_cap(server_args, backend: str) -> int:
    """The cap SGLang runs with when its variable is unset (none of the cases set it): a fixed default but for
    FlashInfer's, derived from the prefill."""
    from capwatch.backends import spec_of
    from sglang.srt.arg_groups import moe_hook, overrides
    from sglang.srt.environ import envs

    if backend != "flashinfer":
        return getattr(envs, spec_of(backend).rules.cap_env_var).get()

    if hasattr(overrides, "flashinfer_a2a_max_dispatch_tokens_per_rank"):  # 0.5.22 on
        return overrides.flashinfer_a2a_max_dispatch_tokens_per_rank(moe_hook.max_prefill_buffer_tokens(server_args))
    # 0.5.19 - 0.5.21 compute it in FlashinferDispatcher.__init__ (which needs a process group), from the
    # published schedule: ``max(cps if cps and cps > 0 else 4096, 4096)``, cps the chunked-prefill size.
    from sglang.srt.runtime_context import get_schedule

    chunked = get_schedule().chunked_prefill_size
    return max(chunked if chunked and chunked > 0 else 4096, 4096)


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
