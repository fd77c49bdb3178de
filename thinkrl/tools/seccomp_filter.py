"""The sandbox's seccomp filter: which system calls model code may not make.

Allow by default (Python and libc use hundreds of calls), refuse by name what
reaches other processes, namespaces, mounts, the kernel's state, or a file's
owner and extended attributes; a call newer than this libseccomp knows is
refused by number (EPERM where it changes something shared; ENOSYS for a
call newer than this list, so libc falls back to an older one)."""

from __future__ import annotations

import errno
import platform
import tempfile

DENIED = (
    # other processes and namespaces
    "ptrace", "process_vm_readv", "process_vm_writev", "pidfd_open", "pidfd_getfd",
    "pidfd_send_signal", "kcmp", "setns", "unshare", "fork", "vfork",
    # the file system's shape and special files
    "mknod", "mknodat", "mount", "umount2", "pivot_root", "chroot", "fsopen", "fsconfig",
    "fsmount", "fspick", "move_mount", "open_tree", "mount_setattr", "open_by_handle_at",
    "name_to_handle_at", "quotactl", "quotactl_fd", "swapon", "swapoff", "uselib", "ustat",
    "sysfs", "fanotify_init", "lookup_dcookie",
    # counted per user, and the calls' user namespace belongs to the trainer's uid
    "inotify_init", "inotify_init1",
    # a file's owner and extended attributes: nothing a program needs, and on a
    # host object (where the mount is writable) a change every namespace sees
    "chown", "fchown", "lchown", "fchownat", "setxattr", "lsetxattr", "fsetxattr",
    "removexattr", "lremovexattr", "fremovexattr",
    # the kernel itself
    "bpf", "perf_event_open", "userfaultfd", "keyctl", "add_key", "request_key",
    "personality", "kexec_load", "kexec_file_load", "init_module", "finit_module",
    "delete_module", "iopl", "ioperm", "modify_ldt", "reboot", "syslog", "acct", "vhangup",
    "settimeofday", "clock_settime", "clock_adjtime", "adjtimex", "sethostname",
    "setdomainname", "move_pages", "migrate_pages", "io_uring_setup", "io_uring_enter",
    "io_uring_register", "memfd_secret", "sync", "syncfs",
    # memory no limit of the process counts: anonymous files, System V and POSIX IPC
    "memfd_create", "shmget", "shmat", "msgget", "msgsnd", "semget", "mq_open", "mq_timedsend",
)
NEWER_DENIED = {457: "statmount", 458: "listmount", 460: "lsm_set_self_attr", 463: "setxattrat",
                466: "removexattrat", 467: "open_tree_attr", 469: "file_setattr"}
"""Calls of Linux 6.8-6.17 (the numbers every architecture but alpha, mips and
ia64 shares from 424 on) that libseccomp 2.5 does not know by name."""
NEWER_ALLOWED = {459: "lsm_get_self_attr", 461: "lsm_list_modules", 462: "mseal", 464: "getxattrat",
                 465: "listxattrat", 468: "file_getattr"}
UNKNOWN_UP_TO = 511
"""Calls numbered above the last one named here, up to this, answer ENOSYS."""
_SHARED_NUMBERING = ("x86_64", "aarch64", "riscv64", "s390x", "ppc64le", "loongarch64")
_CLONE_THREAD = 0x00010000
_CLONE_NAMESPACES = (0x00020000, 0x02000000, 0x04000000, 0x08000000, 0x10000000, 0x20000000,
                     0x40000000, 0x00000080)  # NEWNS, NEWCGROUP, NEWUTS, NEWIPC, NEWUSER, NEWPID, NEWNET, NEWTIME
_AF_UNIX = 1
_TTY_INJECTION = (0x5412, 0x541C)  # TIOCSTI, TIOCLINUX


def seccomp_program() -> bytes:
    """The filter as a BPF program (bwrap loads it before the runner starts).
    Raises OSError/ImportError where libseccomp or pyseccomp is absent."""
    import pyseccomp as sc

    denied = sc.ERRNO(errno.EPERM)
    f = sc.SyscallFilter(sc.ALLOW)
    for name in DENIED:
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
    if platform.machine() in _SHARED_NUMBERING:
        _refuse_newer(f, sc)
    with tempfile.TemporaryFile() as program:
        f.export_bpf(program)
        program.seek(0)
        return program.read()


def _refuse_newer(f, sc) -> None:
    """Rules by number for the calls of NEWER_DENIED and those past NEWER_ALLOWED."""
    for number in NEWER_DENIED:
        f.add_rule(sc.ERRNO(errno.EPERM), number)
    for number in range(max(*NEWER_DENIED, *NEWER_ALLOWED) + 1, UNKNOWN_UP_TO + 1):
        f.add_rule(sc.ERRNO(errno.ENOSYS), number)
