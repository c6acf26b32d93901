"""What the zygote's own tests (``test_zygotes.py``) fork from in place of sglang. At import it reads one
variable by name, scans the whole environment as fsspec and tqdm do, and writes one variable; run as a child,
it prints what it got and exits with the code its argument names (or sleeps, to be killed).

    python -m tests.sglang.zygote_probe CODE|sleep
"""

from __future__ import annotations

import json
import os
import sys
import time

IMPORT_SAW = os.environ.get("CAPWATCH_TEST_READ_AT_IMPORT")
_COPY = dict(os.environ)  # fsspec's scan
_TQDM = {key: value for key, value in os.environ.items() if key.startswith("TQDM_")}  # tqdm's
os.environ.setdefault("CAPWATCH_TEST_WRITTEN_AT_IMPORT", "by the import")

if __name__ == "__main__":
    imported = sys.modules["tests.sglang.zygote_probe"]  # the zygote's import, not this run's
    print(json.dumps({"argv": sys.argv[1:], "cwd": os.getcwd(), "import_saw": imported.IMPORT_SAW,
                      "env": {key: value for key, value in os.environ.items() if key.startswith("CAPWATCH_TEST")}}))
    if sys.argv[1] == "sleep":
        time.sleep(120)
    sys.exit(int(sys.argv[1]))
