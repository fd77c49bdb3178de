"""A Python executor tool: the model's code runs in a jail made for the call
(`thinkrl.tools.jail`: namespaces, a seccomp filter, Landlock, a private
size-capped scratch folder) with a deadline and memory, CPU, output and file
limits, and an audit hook that turns ordinary attempts into readable errors
(`sandbox_runner`). Whatever the code does (loops forever, forks, allocates
10 GB, reads /etc, signals the trainer, switches the hook off), the call
returns text: its output, or an error line for the model. Every process of
the call is gone when it returns, and so is its scratch folder."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from thinkrl.errors import UserError
from thinkrl.tools.call_cgroup import CallCgroup, cgroup_plan
from thinkrl.tools.jail import (RUNNER_DIR, RUNNER_SCRIPT, SANDBOX_UID, SCRATCH, USERS, JailPlan, jail_files,
                                jail_plan, others_may_read, sandbox_environment)
from thinkrl.tools.sandbox_packages import PACKAGES, SITE, package_mounts
from thinkrl.tools.sandbox_process import Launch, run_contained

SCHEMA = {
    "type": "function",
    "function": {
        "name": "python",
        "description": "Run Python code and return what it prints (the standard library, and the "
                       "packages the tool's config names; no network, no files outside the current folder).",
        "parameters": {
            "type": "object",
            "properties": {"code": {"type": "string", "description": "the program; print the result"}},
            "required": ["code"],
        },
    },
}
UNSAFE_KEY = "unsafe_without_kernel_isolation"
_SIGNALS = {int(s) for s in signal.Signals}
_OVERHEAD_MB = 64
"""A call's cgroup holds memory_mb + scratch_mb + this (bwrap, the interpreter's own pages)."""


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
    scratch_mb: int = 64
    """Size of the call's scratch folder (a tmpfs): all its files together."""
    tasks: int = 32
    """Threads of the code (RLIMIT_NPROC; with a cgroup, every task of the call)."""
    packages: tuple[str, ...] = ()
    """Distributions of the trainer's environment the code may import (numpy,
    sympy, ...: with what they require), mounted read-only (`sandbox_packages`)."""
    packages_dir: str | None = None
    """A folder of packages the user prepared (`pip install --target DIR ...`), mounted read-only."""
    audit_hook: bool = True
    """The friendly first layer (clear errors for ordinary attempts). Tests
    switch it off to show that the kernel's layers hold alone."""
    unsafe_without_kernel_isolation: bool = False
    """Run where the kernel's layers (bubblewrap's namespaces, seccomp) cannot
    be had, with the audit hook, limits and Landlock only. NOT A SANDBOX:
    code that switches the hook off reads and writes what the trainer can."""

    def __post_init__(self) -> None:
        if isinstance(self.packages, str) or not all(isinstance(p, str) for p in self.packages):
            raise UserError(f"packages={self.packages!r}: give a list of package names, e.g. [numpy, sympy]")
        object.__setattr__(self, "packages", tuple(self.packages))
        for key in ("wall_s", "cpu_s", "memory_mb", "output_chars", "file_mb", "scratch_mb", "tasks"):
            if not getattr(self, key) > 0:
                raise UserError(f"{key}={getattr(self, key)!r}: must be positive")


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
    """Runs `code` in the jail (`thinkrl.tools.jail`), or, with
    `unsafe_without_kernel_isolation`, in a plain child process; never raises
    for what the code does."""
    start = time.perf_counter()
    plan = jail_plan()
    jailed = not limits.unsafe_without_kernel_isolation
    if jailed and plan.missing:
        return SandboxResult("", "the Python tool's sandbox cannot run here: " + "; ".join(plan.missing),
                             time.perf_counter() - start)
    with contextlib.ExitStack() as stack:
        launch = (_jailed if jailed else _unjailed)(plan, code, limits, stack)
        try:
            done = run_contained(launch, wall_s=limits.wall_s, output_chars=limits.output_chars,
                                 cgroup=_call_cgroup(limits, stack))
        except OSError as err:  # the trainer's side: no cgroup, process or fd could be had
            return SandboxResult("", f"the sandbox could not start the code ({err})", time.perf_counter() - start)
    return SandboxResult(done.stdout, _error(done.status, done.stderr, done.status is None, limits),
                         time.perf_counter() - start)


def _stages(plan: JailPlan, runner_dir: str, scratch: str, limits: SandboxLimits, read_only: list[str],
            writable: list[str], mode: str, import_paths: tuple[str, ...]) -> list[str]:
    """sandbox_lock (the drop to uid 65534 where bwrap ran as root in
    `plan.userns_fd`, then Landlock), which execs sandbox_runner (limits, hook, the code)."""
    jailed = runner_dir == RUNNER_DIR
    drop = [f"--uid={SANDBOX_UID}"] if jailed and plan.userns_fd is not None else []
    runner = [plan.python, "-s", "-S", "-B", "-P", f"{runner_dir}/sandbox_runner.py", scratch,
              str(limits.memory_mb), str(limits.cpu_s), str(limits.file_mb), str(int(limits.audit_hook)),
              str(limits.tasks if jailed and cgroup_plan()[0] is None else 0),  # else pids.max holds them
              mode, ":".join(import_paths)]
    return [plan.python, "-s", "-S", "-B", "-P", f"{runner_dir}/sandbox_lock.py", *drop,
            ":".join([*read_only, *import_paths]),
            ":".join(writable), "--", *runner]


def _jailed(plan: JailPlan, code: str, limits: SandboxLimits, stack, mode: str = "run") -> Launch:
    code_fd = stack.enter_context(_memfd(code.encode()))
    seccomp_fd = stack.enter_context(_memfd(plan.seccomp))
    info_read, info_write = os.pipe()
    stack.callback(os.close, info_read)
    packages = package_mounts(limits.packages, limits.packages_dir)
    command = _stages(plan, RUNNER_DIR, SCRATCH, limits, [*plan.read_only, RUNNER_DIR, "/proc", *USERS],
                      [SCRATCH, "/dev/shm", "/dev/null", "/dev/zero", "/dev/full"], mode, packages.import_paths)
    data_fds = {dest: stack.enter_context(_memfd(data)) for dest, data in jail_files().items()}
    argv = plan.argv(scratch_mb=limits.scratch_mb, code_fd=code_fd, seccomp_fd=seccomp_fd, data_fds=data_fds,
                     mounts=packages.mounts,
                     info_fd=info_write, command=command)
    stack.callback(os.close, info_write)
    return Launch(argv, cwd="/", env=sandbox_environment("/"),
                  pass_fds=(code_fd, seccomp_fd, info_write, *data_fds.values(), *plan.pass_fds()),
                  info_fd=info_read)


def _unjailed(plan: JailPlan, code: str, limits: SandboxLimits, stack, mode: str = "run") -> Launch:
    """The audit hook, limits and Landlock (where the kernel has it) only."""
    scratch = stack.enter_context(tempfile.TemporaryDirectory(prefix="thinkrl-sandbox-",
                                                                ignore_cleanup_errors=True))
    Path(scratch, "main.py").write_text(code)
    runner_dir = str(RUNNER_SCRIPT.parent)
    command = _stages(plan, runner_dir, scratch, limits, [*plan.read_only, runner_dir, "/proc"],
                      [scratch, "/dev/null"], mode,
                      package_mounts(limits.packages, limits.packages_dir).host_import_paths)
    return Launch(command, cwd=scratch, env=sandbox_environment(scratch))


def _call_cgroup(limits: SandboxLimits, stack: contextlib.ExitStack) -> CallCgroup | None:
    """The call's cgroup, closed with `stack`; None where none can be made here (said at start)."""
    group, _ = cgroup_plan()
    if group is None:
        return None
    cgroup = CallCgroup(group, memory_bytes=(limits.memory_mb + limits.scratch_mb + _OVERHEAD_MB) * 2 ** 20,
                        tasks=limits.tasks)
    stack.callback(cgroup.close)
    return cgroup


@contextlib.contextmanager
def _memfd(data: bytes):
    """An anonymous file holding `data`, read from its start (bwrap's --file and
    --seccomp); close-on-exec, so only the call it is passed to inherits it."""
    fd = os.memfd_create("thinkrl-sandbox", os.MFD_CLOEXEC)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        os.lseek(fd, 0, os.SEEK_SET)
        yield fd
    finally:
        os.close(fd)


def _error(code: int | None, errors: str, timed_out: bool, limits: SandboxLimits) -> str | None:
    if timed_out:
        return f"the code ran longer than {limits.wall_s:g} s and was stopped"
    if code == 0:
        return None
    lines = [line for line in errors.strip().splitlines() if line.strip()]
    if code is not None and code > 128 and not lines and code - 128 in _SIGNALS:
        code = 128 - code  # bwrap's PID 1 exits 128 + N when the code dies of signal N
    if code is not None and code < 0:
        name = signal.Signals(-code).name
        reason = {"SIGXCPU": f"it used more than {limits.cpu_s} s of CPU time",
                  "SIGKILL": "it was killed (out of memory?)"}.get(name, name)
        return f"the code was stopped: {reason}"
    return lines[-1] if lines else f"the code exited with status {code}"


class PythonTool:
    """``class_name: thinkrl.tools.sandbox.PythonTool`` in a tool file; its
    ``config`` may set any SandboxLimits field (wall_s, cpu_s, memory_mb, ...).
    Built only where the sandbox holds: the layers found are stated once."""

    def __init__(self, config: dict | None = None, tool_schema: dict | None = None) -> None:
        config = {k: v for k, v in (config or {}).items() if k != "type"}
        if "require_namespace" in config:
            raise UserError(f"require_namespace is gone: the sandbox always needs the kernel's "
                             f"isolation; {UNSAFE_KEY}: true runs code without it (trusted code only)")
        unknown = sorted(set(config) - set(SandboxLimits.__dataclass_fields__))
        if unknown:
            raise UserError(f"unknown key {unknown[0]!r}; the Python tool takes "
                             f"{', '.join(SandboxLimits.__dataclass_fields__)}")
        self.limits = SandboxLimits(**config)
        _check_packages(self.limits)
        self.layers = sandbox_layers(self.limits.unsafe_without_kernel_isolation)
        self.schema = tool_schema or SCHEMA
        self.name = self.schema["function"]["name"]

    def execute(self, parameters: dict) -> str:
        code = parameters.get("code")
        if not isinstance(code, str):
            raise UserError('give the program as {"code": "..."}')
        return run_python(code, self.limits).text()


def _check_packages(limits: SandboxLimits) -> None:
    """The packages exist, and the code's host uid may read them (ValueError with the fix)."""
    mounts = package_mounts(limits.packages, limits.packages_dir).mounts
    if limits.unsafe_without_kernel_isolation or not mounts:
        return
    for host, _ in mounts:
        if jail_plan().host_uid == SANDBOX_UID and not others_may_read(host):
            raise UserError(f"{host}: the tool's code runs as uid {SANDBOX_UID} on this host, which may not read "
                             f"it; make it readable (chmod -R o+rX {host})")
    names = sorted({os.path.basename(host) for host, jail in mounts
                    if jail.startswith(PACKAGES + "/") and not host.endswith(".dist-info")})
    where = names + ([f"{limits.packages_dir} (at {SITE})"] if limits.packages_dir else [])
    print("python tool: importable read-only besides the standard library: " + ", ".join(where),
          file=sys.stderr, flush=True)


_STATED: dict[bool, str] = {}


def sandbox_layers(unsafe: bool = False) -> str:
    """The layers a call gets on this machine, as one line, stated on stderr
    once per process; ValueError (with the way out) where the kernel's layers
    are missing and `unsafe` is not set."""
    if unsafe in _STATED:
        return _STATED[unsafe]
    plan = jail_plan()
    if plan.missing and not unsafe:
        raise UserError("the Python tool's sandbox cannot run here: " + "; ".join(plan.missing) +
                         f". Set {UNSAFE_KEY}: true in the tool's config to run model-written code "
                         "without kernel isolation (NOT A SANDBOX: trusted code only)")
    limits = SandboxLimits(unsafe_without_kernel_isolation=unsafe)
    with contextlib.ExitStack() as stack:
        launch = (_unjailed if unsafe else _jailed)(plan, "", limits, stack, "report")
        # exactly a call's path (cgroup, jail, stages), the runner reporting instead of running
        done = run_contained(launch, wall_s=30.0, output_chars=65536, cgroup=_call_cgroup(limits, stack))
    group, why_not = cgroup_plan()
    if done.status != 0:
        raise UserError("the Python tool's sandbox failed to start here: "
                         f"{(done.stderr.strip().splitlines() or ['exit ' + str(done.status)])[-1]}"
                         + ("" if unsafe else f" ({UNSAFE_KEY}: true runs code without it, trusted code only)"))
    seen = json.loads(done.stdout)
    if unsafe:
        line = ("python tool: UNSAFE, no kernel isolation (unsafe_without_kernel_isolation: true): "
                f"audit hook, limits, Landlock ABI {seen['landlock_abi'] or 'none'}; code that switches "
                "the hook off reads and writes what the trainer can")
    else:
        line = ("python tool sandbox: user/pid/net/mount/ipc/uts/cgroup namespaces, uid "
                f"{seen['uid']} inside (host uid {plan.host_uid}), "
                f"seccomp {'on' if seen['seccomp'] else 'OFF'}, no_new_privs {'on' if seen['no_new_privs'] else 'OFF'}, "
                f"Landlock {'ABI ' + str(seen['landlock_abi']) if seen['landlock_abi'] else 'not in this kernel'}, "
                f"{len(seen['network_interfaces'])} network interface(s), a private scratch tmpfs per call, "
                + (f"a cgroup v{group.version} per call (memory, tasks)" if group is not None else
                   f"NO cgroup per call ({why_not}): memory outside the address space (scratch inodes, "
                   "IPC) and threads of a root host uid are not capped"))
        line += "".join(f"; {note}" for note in plan.notes)
        if not seen["seccomp"] or seen["capabilities"]:
            raise UserError(f"the Python tool's sandbox is weaker than planned here ({line}); "
                             f"{UNSAFE_KEY}: true runs code without it (trusted code only)")
    print(line, file=sys.stderr, flush=True)
    _STATED[unsafe] = line
    return line
