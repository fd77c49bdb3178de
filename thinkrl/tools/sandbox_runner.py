"""The sandbox's child process (``python -s -S -B -P sandbox_runner.py SCRATCH
MEMORY_MB CPU_S FILE_MB REQUIRE_NAMESPACE``): closes what it can, then runs
SCRATCH/main.py. Not imported by thinkrl; `thinkrl.tools.sandbox` starts it.

In order:
- user and network namespaces of its own (no interface but a loopback that
  is down); where the kernel refuses them, the run stops with exit code 3
  unless REQUIRE_NAMESPACE is 0;
- memory, CPU time, file size, core and process limits (the kernel does not
  apply the process limit to root);
- an audit hook that refuses sockets, new processes, ctypes, frame and
  garbage-collector introspection, and any file outside the scratch folder
  (the Python installation stays readable for imports). Everything the hook
  reads is bound in its closure, and this module is not reachable as
  ``__main__`` from the code it runs. Audit hooks are not a security
  boundary on their own (PEP 578); they sit on top of the namespaces.
- fixed seeds (``PYTHONHASHSEED=0`` from the parent, ``random.seed(0)``),
  so the same code prints the same output in every run.
"""

import os
import random
import resource
import signal
import sys
import types

NO_NAMESPACE_EXIT = 3
_BLOCKED_PREFIXES = ("socket.", "ctypes.", "os.exec", "os.posix_spawn", "os.spawn", "os.fork",
                     "os.kill", "os.system", "subprocess.", "pty.", "os.forkpty", "sys.addaudithook",
                     "resource.setrlimit", "resource.prlimit", "signal.pthread_kill", "webbrowser.",
                     "urllib.", "http.", "ftplib.", "smtplib.", "poplib.", "imaplib.", "telnetlib.",
                     "gc.get_", "sys._getframe", "sys._current_frames", "sys.settrace", "sys.setprofile",
                     "cpython.", "mmap.", "os.setsid", "os.setpgid")
_BLOCKED_IMPORTS = ("_posixsubprocess", "_ctypes", "ctypes", "_socket", "socket", "gc",
                    "_multiprocessing", "mmap", "_xxsubinterpreters")
_LISTING_EVENTS = ("os.listdir", "os.scandir", "glob.glob", "os.walk", "os.fwalk")
_PATH_EVENTS = ("os.remove", "os.rename", "os.rmdir", "os.mkdir", "os.chmod", "os.chown", "os.link",
                "os.symlink", "os.truncate", "os.utime", "os.chdir", "os.chflags", "os.setxattr",
                "os.removexattr", "os.listxattr", "shutil.copyfile", "shutil.copymode",
                "shutil.copystat", "shutil.copytree", "shutil.move", "shutil.rmtree", "shutil.chown")


def isolate_network() -> bool:
    """A user and a network namespace of our own; False where the kernel refuses."""
    try:
        import ctypes
        libc = ctypes.CDLL(None, use_errno=True)
        # A user namespace too, also for root: without one, an unprivileged
        # process may not make a network namespace.
        return libc.unshare(0x40000000 | 0x10000000) == 0  # CLONE_NEWNET | CLONE_NEWUSER
    except Exception:
        return False


def limit(memory_mb: int, cpu_s: int, file_mb: int) -> None:
    memory = memory_mb * 2 ** 20
    resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
    resource.setrlimit(resource.RLIMIT_CPU, (cpu_s, cpu_s + 1))
    resource.setrlimit(resource.RLIMIT_FSIZE, (file_mb * 2 ** 20, file_mb * 2 ** 20))
    resource.setrlimit(resource.RLIMIT_NPROC, (0, 0))  # no new process (not binding for root)
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a too-large write raises instead of killing


def audit_hook(scratch: str):
    """The hook; every name it uses is a local of this closure, out of reach
    of the sandboxed code (which cannot reach frames or the garbage collector)."""
    realpath, fsdecode, sep = os.path.realpath, os.fsdecode, os.sep
    readable = tuple({realpath(p) + sep for p in (sys.prefix, sys.base_prefix, sys.exec_prefix)})
    scratch = realpath(scratch)
    own = (scratch + sep,)
    writes = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC
    blocked, blocked_imports = _BLOCKED_PREFIXES, frozenset(_BLOCKED_IMPORTS)
    listing, paths = frozenset(_LISTING_EVENTS), frozenset(_PATH_EVENTS)
    path_types = (str, bytes, os.PathLike)
    denied = PermissionError

    def inside(path, roots) -> bool:
        real = realpath(fsdecode(path))
        return real == scratch or real.startswith(roots)

    def hook(event: str, args: tuple) -> None:
        if event == "open":
            path, mode, flags = args
            if path is None or isinstance(path, int):
                return
            writing = bool(flags & writes) or any(c in (mode or "") for c in "wax+")
            if inside(path, own) or (not writing and inside(path, readable)):
                return
            raise denied(f"the sandbox allows files in its scratch folder only, not {path!r}")
        if event == "import" and args[0] in blocked_imports:
            raise denied(f"the sandbox does not allow the module {args[0]}")
        if event.startswith(blocked):
            raise denied(f"the sandbox does not allow {event}")
        if event in paths or event in listing:
            # The import system lists the installation's folders: listing may read there.
            roots = own + (readable if event in listing else ())
            for path in args:
                if isinstance(path, path_types) and not inside(path, roots):
                    raise denied(f"the sandbox allows files in its scratch folder only, not {path!r}")

    return hook


def main() -> None:
    scratch, memory_mb, cpu_s, file_mb, require_namespace = sys.argv[1], *map(int, sys.argv[2:6])
    with open(os.path.join(scratch, "main.py")) as f:
        code = f.read()
    if not isolate_network() and require_namespace:
        sys.exit(NO_NAMESPACE_EXIT)
    limit(memory_mb, cpu_s, file_mb)
    os.chdir(scratch)
    sys.path[:] = [p for p in sys.path if p and not p.startswith(scratch)]
    compiled = compile(code, "main.py", "exec")
    random.seed(0)
    program = types.ModuleType("__main__")
    program.__builtins__ = __builtins__
    sys.modules["__main__"] = program  # this module is out of the program's reach
    hook = audit_hook(scratch)
    sys.addaudithook(hook)
    del hook
    exec(compiled, program.__dict__)


if __name__ == "__main__":
    main()
