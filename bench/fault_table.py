"""Rerun the fault tests and print the fault table of docs/reliability.md.

    PYTHONPATH=. python bench/fault_table.py            # all of tests/faults (a few minutes)
    PYTHONPATH=. python bench/fault_table.py -k reward  # a subset (pytest -k)

Each test in tests/faults reproduces one fault on a tiny run and asserts what
is left on disk; its docstring holds the table row ("Case: ... Behaviour:
... Kept: ..."). This script runs them with pytest, reads each outcome from
the JUnit report and prints one Markdown row per test with its result, then
the cost of the checkpoint checksums (sha256 throughput on this CPU).
"""

from __future__ import annotations

import argparse
import hashlib
import importlib
import os
import re
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
FAULTS = REPO / "tests" / "faults"
_FIELDS = re.compile(r"Case:(?P<case>.*?)Behaviour:(?P<behaviour>.*?)Kept:(?P<kept>.*)", re.S)


def outcomes(pytest_args: list[str]) -> dict[tuple[str, str], str]:
    """{(module, test): "pass" | "FAIL" | "skip"} from one pytest run."""
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "junit.xml"
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), env_path()])}
        subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                        f"--junitxml={report}", str(FAULTS), *pytest_args], cwd=REPO, env=env,
                       check=False)
        results = {}
        for case in ET.parse(report).getroot().iter("testcase"):
            module = case.get("classname", "").rsplit(".", 1)[-1]
            status = "pass"
            if case.find("failure") is not None or case.find("error") is not None:
                status = "FAIL"
            elif case.find("skipped") is not None:
                status = "skip"
            results[(module, case.get("name", ""))] = status
        return results


def env_path() -> str:
    return os.environ.get("PYTHONPATH", "")


def rows(results: dict[tuple[str, str], str]) -> list[tuple[str, str, str, str]]:
    """(case, behaviour, kept, result) per test that ran, in file order."""
    sys.path.insert(0, str(FAULTS))
    table = []
    for path in sorted(FAULTS.glob("test_*.py")):
        module = importlib.import_module(path.stem)
        for name, function in vars(module).items():
            if not name.startswith("test_") or (path.stem, name) not in results:
                continue
            match = _FIELDS.search(function.__doc__ or "")
            if match is None:
                raise SystemExit(f"{path.name}::{name}: docstring lacks Case:/Behaviour:/Kept:")
            fields = [" ".join(match.group(k).split()) for k in ("case", "behaviour", "kept")]
            table.append((*fields, results[(path.stem, name)]))
    return table


def sha256_throughput(megabytes: int = 64) -> float:
    data = os.urandom(megabytes * 2**20)
    start = time.perf_counter()
    hashlib.sha256(data).hexdigest()
    return megabytes / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-k", help="only the tests matching this pytest -k expression")
    args = parser.parse_args()
    results = outcomes(["-k", args.k] if args.k else [])
    print("\n| Case | Behaviour | Kept on disk | Test |")
    print("|---|---|---|---|")
    for case, behaviour, kept, result in rows(results):
        print(f"| {case} | {behaviour} | {kept} | {result} |")
    print(f"\nsha256 of checkpoint files: {sha256_throughput():.0f} MiB/s on this CPU "
          "(hashlib, one core)")


if __name__ == "__main__":
    main()
