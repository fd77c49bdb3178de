"""A Python executor tool: the model's code runs in a child process with a
deadline and memory, CPU, output and file limits, no network and no file
outside a scratch folder made for the call (`sandbox_runner` says how each
limit is held). Whatever the code does (loops forever, forks, allocates
10 GB, reads /etc, opens a socket), the call returns text: its output, or an
error line for the model. The scratch folder and every process of the call
are gone when it returns."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

RUNNER = Path(__file__).with_name("sandbox_runner.py")
NO_NAMESPACE_EXIT = 3  # sandbox_runner's exit code when it cannot isolate the network
SCHEMA = {
    "type": "function",
    "function": {
        "name": "python",
        "description": "Run Python code and return what it prints (standard library only; "
                       "no network, no files outside the current folder).",
        "parameters": {
            "type": "object",
            "properties": {"code": {"type": "string", "description": "the program; print the result"}},
            "required": ["code"],
        },
    },
}


@dataclass(frozen=True)
class SandboxLimits:
    wall_s: float = 5.0
    """Seconds before the process (and any it made) is killed."""
    cpu_s: int = 5
    memory_mb: int = 512
    """Address space of the process: a larger allocation raises MemoryError."""
    output_chars: int = 4096
    """Characters of standard output (and error) read back."""
    file_mb: int = 16
    """Largest file the code may write, its output included."""
    require_namespace: bool = True
    """Refuse to run where the kernel will not give the process network (and
    user) namespaces of its own; False runs it with the audit hook alone
    (not a security boundary: only for trusted code)."""


@dataclass(frozen=True)
class SandboxResult:
    output: str
    error: str | None
    """Why the run failed (exception, time-out, limit); None when it exited 0."""
    seconds: float

    def text(self) -> str:
        """What the model reads."""
        if self.error is None:
            return self.output
        return (self.output + "\n" if self.output else "") + f"error: {self.error}"


def run_python(code: str, limits: SandboxLimits = SandboxLimits()) -> SandboxResult:
    start = time.perf_counter()
    scratch = Path(tempfile.mkdtemp(prefix="thinkrl-sandbox-"))
    try:
        (scratch / "main.py").write_text(code)
        with open(scratch / ".stdout", "w+b") as out, open(scratch / ".stderr", "w+b") as err:
            # -s -S: no user or site packages; -P: the script's folder is not on the path;
            # the environment is this one line (PYTHONHASHSEED: the same output every run).
            process = subprocess.Popen(
                [sys.executable, "-s", "-S", "-B", "-P", str(RUNNER), str(scratch), str(limits.memory_mb),
                 str(limits.cpu_s), str(limits.file_mb), str(int(limits.require_namespace))],
                stdin=subprocess.DEVNULL, stdout=out, stderr=err, cwd=scratch,
                env={"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "PYTHONHASHSEED": "0"},
                start_new_session=True)
            code_ = _wait_then_kill_group(process, limits.wall_s)
            timed_out = code_ is None
            output, errors = _head(out, limits.output_chars), _tail(err, limits.output_chars)
        return SandboxResult(output, _error(code_, errors, timed_out, limits),
                             time.perf_counter() - start)
    finally:
        shutil.rmtree(scratch, onerror=_writable_then_retry)


def _writable_then_retry(function, path, _exc) -> None:
    """rmtree's error handler: a folder the code made unreadable is opened up and removed."""
    try:
        os.chmod(os.path.dirname(path), 0o700)
        os.chmod(path, 0o700)
        function(path)
    except OSError:
        shutil.rmtree(path, ignore_errors=True)


def _wait_then_kill_group(process: subprocess.Popen, wall_s: float) -> int | None:
    """The child's exit status (None past `wall_s`), after its process group
    (anything it managed to start) is killed. The child is reaped only after
    the kill, so its id, which names the group, cannot be reused meanwhile."""
    deadline = time.monotonic() + wall_s
    exited = None
    while exited is None and time.monotonic() < deadline:
        exited = os.waitid(os.P_PID, process.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        if exited is None:
            time.sleep(0.005)
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    status = process.wait()
    return None if exited is None else status


def _head(f, chars: int) -> str:
    f.seek(0)
    text = f.read(chars * 4).decode("utf-8", "replace")
    return text[:chars] + ("...(truncated)" if len(text) > chars else "")


def _tail(f, chars: int) -> str:
    f.seek(0, os.SEEK_END)
    f.seek(max(0, f.tell() - chars * 4))
    return f.read().decode("utf-8", "replace")[-chars:]


def _error(code: int | None, errors: str, timed_out: bool, limits: SandboxLimits) -> str | None:
    if timed_out:
        return f"the code ran longer than {limits.wall_s:g} s and was stopped"
    if code == 0:
        return None
    if code == NO_NAMESPACE_EXIT:
        return ("this machine does not let the sandbox make its own network namespace, so the code "
                "was not run (require_namespace: false in the tool's config runs it with the audit "
                "hook alone, for trusted code only)")
    if code is not None and code < 0:
        name = signal.Signals(-code).name
        reason = {"SIGXCPU": f"it used more than {limits.cpu_s} s of CPU time",
                  "SIGKILL": "it was killed (out of memory?)"}.get(name, name)
        return f"the code was stopped: {reason}"
    lines = [line for line in errors.strip().splitlines() if line.strip()]
    return lines[-1] if lines else f"the code exited with status {code}"


class PythonTool:
    """``class_name: thinkrl.tools.sandbox.PythonTool`` in a tool file; its
    ``config`` may set any SandboxLimits field (wall_s, cpu_s, memory_mb, ...)."""

    def __init__(self, config: dict | None = None, tool_schema: dict | None = None) -> None:
        config = {k: v for k, v in (config or {}).items() if k != "type"}
        self.limits = SandboxLimits(**config)
        self.schema = tool_schema or SCHEMA
        self.name = self.schema["function"]["name"]

    def execute(self, parameters: dict) -> str:
        code = parameters.get("code")
        if not isinstance(code, str):
            raise ValueError('give the program as {"code": "..."}')
        return run_python(code, self.limits).text()
