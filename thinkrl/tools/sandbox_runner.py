"""The sandbox's child process (``python -I -S -B sandbox_runner.py SCRATCH
MEMORY_MB CPU_S FILE_MB``): closes what it can, then runs SCRATCH/main.py.
Not imported by thinkrl; `thinkrl.tools.sandbox` starts it.

In order: user and network namespaces of its own (no interface but a
loopback that is down), when the kernel lets this process make them; memory, CPU time, file size and process limits; then an
audit hook that refuses sockets, new processes, ctypes and any file outside
the scratch folder (the Python installation stays readable for imports).
The hook is the layer that holds everywhere; the others hold where the
machine allows them (docs/agents.md)."""

import os
import resource
import signal
import sys

_BLOCKED_PREFIXES = ("socket.", "ctypes.", "os.exec", "os.posix_spawn", "os.spawn", "os.fork",
                     "os.kill", "os.system", "subprocess.", "pty.", "os.forkpty", "sys.addaudithook",
                     "_posixsubprocess", "os.setuid", "os.setgid", "resource.setrlimit",
                     "signal.pthread_kill", "webbrowser.", "urllib.", "http.", "ftplib.", "smtplib.",
                     "poplib.", "imaplib.", "telnetlib.")
_LISTING_EVENTS = ("os.listdir", "os.scandir", "glob.glob", "os.walk", "os.fwalk")
_PATH_EVENTS = ("os.remove", "os.rename", "os.rmdir", "os.mkdir",
                "os.chmod", "os.chown", "os.link", "os.symlink", "os.truncate", "os.utime",
                "os.chdir", "os.chflags", "os.setxattr", "os.removexattr", "os.listxattr",
                "shutil.copyfile", "shutil.copymode", "shutil.copystat", "shutil.copytree",
                "shutil.move", "shutil.rmtree", "shutil.chown")


def isolate_network() -> str:
    try:
        import ctypes
        libc = ctypes.CDLL(None, use_errno=True)
        # A user namespace too, also for root: its process count is then its
        # own, so RLIMIT_NPROC binds (root is exempt from it in the first namespace).
        flags = 0x40000000 | 0x10000000  # CLONE_NEWNET | CLONE_NEWUSER
        return "namespace" if libc.unshare(flags) == 0 else "audit hook"
    except Exception:
        return "audit hook"


def limit(memory_mb: int, cpu_s: int, file_mb: int) -> None:
    memory = memory_mb * 2 ** 20
    resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
    resource.setrlimit(resource.RLIMIT_CPU, (cpu_s, cpu_s + 1))
    resource.setrlimit(resource.RLIMIT_FSIZE, (file_mb * 2 ** 20, file_mb * 2 ** 20))
    resource.setrlimit(resource.RLIMIT_NPROC, (0, 0))  # no new process
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a too-large write raises instead of killing


def audit_hook(scratch: str):
    readable = tuple({os.path.realpath(p) + os.sep for p in (sys.prefix, sys.base_prefix, sys.exec_prefix)})
    scratch = os.path.realpath(scratch)
    writes = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC

    def inside(path, roots) -> bool:
        real = os.path.realpath(os.fsdecode(path))
        return real == scratch or real.startswith(tuple(roots))

    def hook(event: str, args: tuple) -> None:
        if event == "open":
            path, mode, flags = args
            if path is None or isinstance(path, int):
                return
            writing = bool(flags & writes) or any(c in (mode or "") for c in "wax+")
            if inside(path, (scratch + os.sep,)) or (not writing and inside(path, readable)):
                return
            raise PermissionError(f"the sandbox allows files in its scratch folder only, not {path!r}")
        if event.startswith(_BLOCKED_PREFIXES):
            raise PermissionError(f"the sandbox does not allow {event}")
        if event in _PATH_EVENTS or event in _LISTING_EVENTS:
            # The import system lists the installation's folders: listing may read there.
            roots = (scratch + os.sep,) + (readable if event in _LISTING_EVENTS else ())
            for path in args:
                if isinstance(path, (str, bytes, os.PathLike)) and not inside(path, roots):
                    raise PermissionError(f"the sandbox allows files in its scratch folder only, not {path!r}")

    return hook


def main() -> None:
    scratch, memory_mb, cpu_s, file_mb = sys.argv[1], *map(int, sys.argv[2:5])
    with open(os.path.join(scratch, "main.py")) as f:
        code = f.read()
    network = isolate_network()
    limit(memory_mb, cpu_s, file_mb)
    os.chdir(scratch)
    sys.path[:] = [p for p in sys.path if p and not p.startswith(scratch)]
    compiled = compile(code, "main.py", "exec")
    sys.addaudithook(audit_hook(scratch))
    del network
    exec(compiled, {"__name__": "__main__", "__builtins__": __builtins__})


if __name__ == "__main__":
    main()
