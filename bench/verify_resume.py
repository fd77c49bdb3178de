"""Seconds to verify one large checkpoint file at resume (its sha256 pieces):
writes a 4 GiB file of random bytes with its digests under /tmp, verifies it
once to warm the page cache, then times a second verification.

    python bench/verify_resume.py [CHECKOUT]     # CHECKOUT: the thinkrl tree to time (default: this one)
"""

import json
import os
import shutil
import sys
import time
from pathlib import Path

sys.path.insert(0, sys.argv[1] if len(sys.argv) > 1 else str(Path(__file__).resolve().parents[1]))
from thinkrl.checkpoint.verify import MARKER, file_digests, verify_checkpoint  # noqa: E402

folder = Path("/tmp/thinkrl-verify-bench/global_step_1")
try:
    (folder / "actor").mkdir(parents=True, exist_ok=True)
    with open(folder / "actor" / "optimizer.pt", "wb") as f:
        for _ in range(4):
            f.write(os.urandom(2**30))
    (folder / MARKER).write_text(json.dumps({"files": file_digests(folder)}))
    verify_checkpoint(folder)
    start = time.perf_counter()
    verify_checkpoint(folder)
    print(f"{time.perf_counter() - start:.2f} s to verify 4 GiB")
finally:
    shutil.rmtree(folder.parent, ignore_errors=True)
