"""The sandbox's first stage (``python -s -S -B -P sandbox_lock.py [--uid=N] READ_ONLY WRITABLE -- RUNNER...``):
drops to uid N where bwrap started it as root of a namespace made for that
(``jail.nobody_userns``), restricts this process with Landlock, then replaces
itself with the runner, which inherits all of it. Not imported by thinkrl.

It uses ctypes to make the system calls; the exec leaves ctypes behind, so
the model's code never shares a process with a loaded ctypes.

READ_ONLY and WRITABLE are colon-separated folders. Reads (and exec) are
allowed below READ_ONLY, everything below WRITABLE; no TCP bind or connect
(ABI 4), no signal to a process outside this sandbox and no abstract unix
socket outside it (ABI 6). The ABI applied (0 where the kernel has no
Landlock) is passed to the runner as ``--landlock=N``.
"""

import ctypes
import os
import sys

_CREATE_RULESET, _ADD_RULE, _RESTRICT_SELF = 444, 445, 446  # the same on every architecture
_VERSION = 1  # LANDLOCK_CREATE_RULESET_VERSION
_PATH_BENEATH = 1
_PR_SET_NO_NEW_PRIVS = 38
_PR_CAPBSET_DROP = 24
_CAP_VERSION_3 = 0x20080522

EXECUTE, WRITE_FILE, READ_FILE, READ_DIR = 1, 2, 4, 8
_FS_BY_ABI = {1: (1 << 13) - 1, 2: (1 << 14) - 1, 3: (1 << 15) - 1, 4: (1 << 15) - 1,
              5: (1 << 16) - 1}
_FILE_RIGHTS = EXECUTE | WRITE_FILE | READ_FILE | (1 << 14) | (1 << 15)  # + TRUNCATE, IOCTL_DEV
_TCP = 1 | 2  # BIND_TCP, CONNECT_TCP (ABI 4)
_SCOPES = 1 | 2  # ABSTRACT_UNIX_SOCKET, SIGNAL (ABI 6)


class _Ruleset(ctypes.Structure):
    _fields_ = [("fs", ctypes.c_uint64), ("net", ctypes.c_uint64), ("scoped", ctypes.c_uint64)]


class _PathBeneath(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


def restrict(read_only: list[str], writable: list[str]) -> int:
    """Applies Landlock to this process; the ABI applied, 0 where there is none."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    abi = libc.syscall(_CREATE_RULESET, None, ctypes.c_size_t(0), ctypes.c_uint32(_VERSION))
    if abi <= 0:
        return 0
    fs = _FS_BY_ABI[min(abi, 5)]
    attr = _Ruleset(fs, _TCP if abi >= 4 else 0, _SCOPES if abi >= 6 else 0)
    size = 8 if abi < 4 else 16 if abi < 6 else 24
    ruleset = libc.syscall(_CREATE_RULESET, ctypes.byref(attr), ctypes.c_size_t(size), ctypes.c_uint32(0))
    if ruleset < 0:
        raise OSError(ctypes.get_errno(), "landlock_create_ruleset")
    for paths, rights in ((read_only, EXECUTE | READ_FILE | READ_DIR), (writable, fs)):
        for path in paths:
            _allow(libc, ruleset, path, rights & fs)
    if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS)")
    if libc.syscall(_RESTRICT_SELF, ruleset, ctypes.c_uint32(0)) != 0:
        raise OSError(ctypes.get_errno(), "landlock_restrict_self")
    os.close(ruleset)
    return abi


def _allow(libc, ruleset: int, path: str, rights: int) -> None:
    try:
        fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
    except FileNotFoundError:
        return
    try:
        if not os.path.isdir(path):
            rights &= _FILE_RIGHTS
        rule = _PathBeneath(rights, fd)
        if libc.syscall(_ADD_RULE, ruleset, _PATH_BENEATH, ctypes.byref(rule), ctypes.c_uint32(0)) != 0:
            raise OSError(ctypes.get_errno(), f"landlock_add_rule({path})")
    finally:
        os.close(fd)


def drop_to(uid: int) -> None:
    """Becomes `uid` (and its gid, no groups) for good: bwrap ran this stage
    as root of a namespace mapping `uid` to the same host uid, keeping only
    CAP_SETUID, CAP_SETGID and CAP_SETPCAP for this. The bounding set is
    emptied first, changing every uid clears the permitted and effective
    sets, then the inheritable one is emptied."""
    libc = ctypes.CDLL(None, use_errno=True)
    os.setgroups([])
    os.setresgid(uid, uid, uid)
    for cap in range(64):  # EINVAL past the kernel's last capability
        libc.prctl(_PR_CAPBSET_DROP, cap, 0, 0, 0)
    os.setresuid(uid, uid, uid)  # clears the permitted and effective sets
    header, data = (ctypes.c_uint32 * 2)(_CAP_VERSION_3, 0), (ctypes.c_uint32 * 6)()
    if libc.capset(header, data) != 0:  # and now the inheritable one
        raise OSError(ctypes.get_errno(), "capset")
    with open("/proc/self/status") as f:
        held = {k: v.strip() for k, _, v in (line.partition(":") for line in f)}
    if any(int(held[key], 16) for key in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb")):
        raise SystemExit(f"sandbox_lock: capabilities survived the drop ({held})")


def main() -> None:
    args = sys.argv[1:]
    if args[0].startswith("--uid="):
        drop_to(int(args.pop(0)[len("--uid="):]))
    read_only, writable, dash, *runner = args
    assert dash == "--" and runner, "usage: sandbox_lock.py [--uid=N] READ_ONLY WRITABLE -- RUNNER..."
    abi = restrict([p for p in read_only.split(":") if p], [p for p in writable.split(":") if p])
    os.closerange(3, 1 << 20)  # only 0-2 reach the code (bwrap passes its --userns fd on)
    os.execv(runner[0], runner + [f"--landlock={abi}"])


if __name__ == "__main__":
    main()
