"""The sandbox's last stage (``python -s -S -B -P sandbox_runner.py SCRATCH MEMORY_MB CPU_S FILE_MB
HOOK TASKS MODE IMPORT_PATHS --landlock=N``): sets limits and the audit hook, then runs
SCRATCH/main.py (MODE ``run``), or prints what isolates it as one JSON line
(MODE ``report``: the layers thinkrl states at start). Not imported by
thinkrl; `thinkrl.tools.sandbox` starts it, inside the jail of
`thinkrl.tools.jail` and after `sandbox_lock.py`'s Landlock.

The kernel holds the boundary (namespaces, seccomp, Landlock). This stage
adds:
- memory, CPU time, file size, thread, open file, message queue, locked
  memory and core limits;
- an audit hook (HOOK 1) that turns the usual attempts (sockets, new
  processes, ctypes, other threads' frames, tracing, garbage-collector
  introspection, files outside the scratch folder) into a clear
  PermissionError (ImportError for a module) for the model. The standard
  library must keep working under it: `sys._getframe` is allowed (namedtuple,
  enum, typing and dataclasses call it; a frame reaches nothing a traceback
  does not). It is a
  courtesy, not a wall (PEP 578): code that switches it off meets the kernel's
  refusals instead. Tests run with HOOK 0 to show that the kernel holds alone.
- fixed seeds (``PYTHONHASHSEED=0`` from the parent, ``random.seed(0)``),
  so the same code prints the same output in every run.
"""

import json
import os
import random
import resource
import signal
import sys
import types

_BLOCKED_PREFIXES = ("socket.", "ctypes.", "os.exec", "os.posix_spawn", "os.spawn", "os.fork",
                     "os.kill", "os.system", "subprocess.", "pty.", "os.forkpty", "sys.addaudithook",
                     "resource.setrlimit", "resource.prlimit", "signal.pthread_kill", "webbrowser.",
                     "urllib.", "http.", "ftplib.", "smtplib.", "poplib.", "imaplib.", "telnetlib.",
                     "gc.get_", "sys._current_frames", "sys.settrace", "sys.setprofile",
                     "cpython.", "mmap.", "os.setsid", "os.setpgid", "code.__new__", "function.__new__",
                     "os.add_dll_directory", "_ctypes.")
# gc, socket and _multiprocessing themselves are fine (sympy, asyncio and
# multiprocessing.pool import them): object walks, sockets other than AF_UNIX
# and new processes are refused by event
_BLOCKED_MODULES = ("mmap", "_xxsubinterpreters", "_testcapi", "_testinternalcapi")
_PACKAGE_MODULES = ("ctypes", "_ctypes")
"""Refused unless packages are mounted (sympy imports ctypes at its start):
then library loads, symbol lookups and foreign calls stay refused by event,
but ctypes' raw memory is in reach, so the hook is easier to switch off (the
kernel's layers do not depend on it). `_posixsubprocess` (which asyncio and
subprocess import) is allowed: a new process meets the seccomp filter."""
_LISTING_EVENTS = ("os.listdir", "os.scandir", "glob.glob", "os.walk", "os.fwalk")
_PATH_EVENTS = ("os.remove", "os.rename", "os.rmdir", "os.mkdir", "os.chmod", "os.chown", "os.link",
                "os.symlink", "os.truncate", "os.utime", "os.chdir", "os.chflags", "os.setxattr",
                "os.removexattr", "os.listxattr", "shutil.copyfile", "shutil.copymode",
                "shutil.copystat", "shutil.copytree", "shutil.move", "shutil.rmtree", "shutil.chown",
                "sqlite3.connect")


def limit(memory_mb: int, cpu_s: int, file_mb: int, tasks: int) -> None:
    memory = memory_mb * 2 ** 20
    resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
    resource.setrlimit(resource.RLIMIT_CPU, (cpu_s, cpu_s + 1))
    resource.setrlimit(resource.RLIMIT_FSIZE, (file_mb * 2 ** 20, file_mb * 2 ** 20))
    # Threads (the seccomp filter refuses new processes), where no cgroup of
    # the call holds them (pids.max): RLIMIT_NPROC counts every task of the uid,
    # so concurrent calls would share it. 0: a cgroup holds them, or unjailed.
    if tasks > 0:
        resource.setrlimit(resource.RLIMIT_NPROC, (tasks, tasks))
    # Queued signals are counted per user up to the namespace's owner (the
    # trainer's uid): a call may hold few.
    resource.setrlimit(resource.RLIMIT_SIGPENDING, (64, 64))
    resource.setrlimit(resource.RLIMIT_NOFILE, (256, 256))
    resource.setrlimit(resource.RLIMIT_MSGQUEUE, (0, 0))
    resource.setrlimit(resource.RLIMIT_MEMLOCK, (0, 0))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a too-large write raises instead of killing


def audit_hook(scratch: str, import_paths: list[str]):
    """The hook; every name it uses is a local of this closure, out of reach
    of ordinary code (which cannot reach the garbage collector or change a
    closure through a frame)."""
    realpath, fsdecode, sep, is_a, str_, int_ = os.path.realpath, os.fsdecode, os.sep, isinstance, str, int
    readable = tuple({realpath(p) + sep for p in (sys.prefix, sys.base_prefix, sys.exec_prefix, *import_paths,
                                                  "/usr/share/zoneinfo")})
    af_unix = 1
    getframe, types_py = sys._getframe, realpath(types.__file__)
    scratch = realpath(scratch)
    own = (scratch + sep,)
    writes = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC
    blocked = _BLOCKED_PREFIXES
    blocked_modules = frozenset(_BLOCKED_MODULES + (() if import_paths else _PACKAGE_MODULES))
    listing, paths = frozenset(_LISTING_EVENTS), frozenset(_PATH_EVENTS)
    path_types = (str, bytes, os.PathLike)
    denied, unavailable = PermissionError, ImportError

    def inside(path, roots) -> bool:
        real = realpath(fsdecode(path))
        return (real + sep).startswith(roots)  # a root itself, or below one

    def hook(event: str, args: tuple) -> None:
        if event == "open":
            path, mode, flags = args
            if path is None or is_a(path, int_):
                return
            writing = bool(flags & writes) or any(c in (mode or "") for c in "wax+")
            if inside(path, own) or (not writing and inside(path, readable)):
                return
            raise denied(f"the sandbox allows files in its scratch folder only, not {path!r}")
        if event == "import":
            # x._posixsubprocess loads the same extension as _posixsubprocess.
            name = str_(args[0]).rpartition(".")[2]
            if name in blocked_modules or args[0] in blocked_modules:
                # ImportError: libraries that do `try: import ctypes / except ImportError` go on
                raise unavailable(f"the sandbox does not allow the module {args[0]}", name=args[0])
        if event == "ctypes.dlopen" and args[0] is None:
            return  # `import ctypes` opens the running program (ctypes.pythonapi); its symbols stay refused
        if event == "code.__new__":  # types.coroutine (asyncio) flips a flag with code.replace
            caller = getframe(1).f_code
            if caller.co_name == "coroutine" and caller.co_filename == types_py:
                return
        if event.startswith("socket."):  # a unix socket stays in the call (asyncio's self-pipe)
            family = args[1] if event == "socket.__new__" else getattr(args[0], "family", None)
            if family == af_unix:
                return
        if event.startswith(blocked):
            raise denied(f"the sandbox does not allow {event}")
        if event in paths or event in listing:
            # The import system lists the installation's folders: listing may read there.
            roots = own + (readable if event in listing else ())
            for path in args:
                if is_a(path, path_types) and not inside(path, roots):
                    raise denied(f"the sandbox allows files in its scratch folder only, not {path!r}")

    return hook


def layers(landlock_abi: int) -> dict:
    """What isolates this process, as the kernel reports it."""
    status = {}
    with open("/proc/self/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            status[key] = value.strip()
    with open("/proc/self/uid_map") as f:
        uid_map = f.read().split()
    return {"uid": os.getuid(), "uid_map": uid_map, "pid": os.getpid(),
            "seccomp": status.get("Seccomp") == "2", "no_new_privs": status.get("NoNewPrivs") == "1",
            "capabilities": int(status.get("CapEff", "0"), 16), "landlock_abi": landlock_abi,
            "network_interfaces": _interfaces()}


def _interfaces() -> list[str]:
    with open("/proc/net/dev") as f:
        return sorted(line.split(":")[0].strip() for line in f.readlines()[2:])


def main() -> None:
    args = sys.argv[1:]
    landlock_abi = int(args.pop()[len("--landlock="):]) if args[-1].startswith("--landlock=") else 0
    scratch, memory_mb, cpu_s, file_mb, hook_on, tasks, mode = args[0], *map(int, args[1:6]), args[6]
    import_paths = [p for p in args[7].split(":") if p]
    if mode == "report":
        print(json.dumps(layers(landlock_abi)))
        return
    with open(os.path.join(scratch, "main.py")) as f:
        code = f.read()
    limit(memory_mb, cpu_s, file_mb, tasks)
    os.chdir(scratch)
    sys.path[:] = [p for p in sys.path if p and not p.startswith(scratch)] + import_paths
    compiled = compile(code, "main.py", "exec")
    random.seed(0)
    program = types.ModuleType("__main__")
    program.__builtins__ = __builtins__
    sys.modules["__main__"] = program  # this module is out of the program's reach
    if hook_on:
        hook = audit_hook(scratch, import_paths)
        sys.addaudithook(hook)
        del hook
    exec(compiled, program.__dict__)


if __name__ == "__main__":
    main()
