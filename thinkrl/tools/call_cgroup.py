"""A cgroup per sandbox call, where the trainer may make one: caps what the
process limits cannot see, and kills every task of the call at its end.

- memory: everything the call holds (the code's pages, its scratch tmpfs's
  files and inodes, memfds, System V and POSIX IPC, kernel memory), which an
  address-space limit does not count: a call that passes it is OOM-killed;
- pids: tasks (threads included) of the call; the kernel exempts a root host
  uid from RLIMIT_NPROC, not from a cgroup.

cgroup v2 or v1 (the memory and pids hierarchies, writable). On v2 the
trainer's own cgroup must offer memory and pids (its parent delegates them),
and, since v2 gives no controller to the children of a cgroup that holds
processes itself, the trainer (and what it started) first moves into a leaf
of its own, ``thinkrl-trainer``; where that cgroup holds other processes
too, nothing is moved and the start line says how to run the trainer in a
cgroup of its own. Elsewhere the call runs without, and the tool says so at
start. The call enters its cgroup
before bwrap starts (`wrap`: a shell writes its pid, then execs), so nothing
of the call ever runs outside it.
"""

from __future__ import annotations

import os
import secrets
import signal
import time
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

ROOT = Path("/sys/fs/cgroup")
_ENTER = 'while [ "$1" != -- ]; do echo $$ > "$1" || exit 125; shift; done; shift; exec "$@"'


@dataclass(frozen=True)
class CgroupPlan:
    memory: Path
    """The folder new memory cgroups are made in."""
    pids: Path
    """The folder new pids cgroups are made in (the same as memory on v2)."""
    version: int


class CallCgroup:
    """One call's cgroup(s): made with limits, entered by `wrap`, emptied and removed by `close`."""

    def __init__(self, plan: CgroupPlan, *, memory_bytes: int, tasks: int) -> None:
        name = f"thinkrl-sandbox-{secrets.token_hex(6)}"
        self.folders = list(dict.fromkeys([plan.memory / name, plan.pids / name]))
        made = []
        try:
            for folder in self.folders:
                folder.mkdir()
                made.append(folder)
            if plan.version == 2:
                _write(self.folders[0] / "memory.max", memory_bytes)
                _write(self.folders[0] / "memory.swap.max", 0, missing_ok=True)
            else:
                _write(self.folders[0] / "memory.limit_in_bytes", memory_bytes)
                try:  # memory + swap, where swap is accounted
                    _write(self.folders[0] / "memory.memsw.limit_in_bytes", memory_bytes, missing_ok=True)
                except OSError:
                    pass
            _write(self.folders[-1] / "pids.max", tasks)
        except OSError:
            self.folders = made
            self.close()
            raise

    def wrap(self, argv: list[str]) -> list[str]:
        """`argv` run inside the cgroup from its first instruction."""
        return ["/bin/sh", "-c", _ENTER, "sh", *(str(f / "cgroup.procs") for f in self.folders), "--", *argv]

    def kill(self) -> None:
        """SIGKILL to every task still in the cgroup (v2: cgroup.kill)."""
        folder = self.folders[-1]
        if (folder / "cgroup.kill").exists():
            _write(folder / "cgroup.kill", 1, missing_ok=True)
            return
        for _ in range(50):
            pids = _pids(folder)
            if not pids:
                return
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            time.sleep(0.002)

    def close(self) -> None:
        self.kill()
        for folder in self.folders:
            for attempt in range(200):  # a killed task leaves its cgroup once the kernel has reaped it
                try:
                    folder.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    if attempt % 20 == 19:
                        self.kill()
                    time.sleep(0.01)


def _pids(folder: Path) -> list[int]:
    try:
        return [int(p) for p in (folder / "cgroup.procs").read_text().split()]
    except FileNotFoundError:
        return []


def _write(path: Path, value: int | str, *, missing_ok: bool = False) -> None:
    try:
        path.write_text(str(value))
    except FileNotFoundError:
        if not missing_ok:
            raise


@lru_cache(maxsize=1)
def cgroup_plan() -> tuple[CgroupPlan | None, str]:
    """Where this process can make per-call cgroups, or None and why not."""
    own = {}
    try:
        for line in Path("/proc/self/cgroup").read_text().splitlines():
            _, controllers, path = line.split(":", 2)
            own[controllers] = path.lstrip("/")
    except OSError as err:
        return None, f"cannot read /proc/self/cgroup ({err})"
    candidates = []
    memory_key = next((k for k in own if "memory" in k.split(",")), None)
    pids_key = next((k for k in own if "pids" in k.split(",")), None)
    if memory_key and pids_key:
        candidates.append(CgroupPlan(ROOT / memory_key / own[memory_key], ROOT / pids_key / own[pids_key], 1))
    if "" in own:
        for mount in (ROOT, ROOT / "unified"):
            if (mount / "cgroup.controllers").exists():
                folder = mount / own[""]
                candidates.append(CgroupPlan(folder, folder, 2))
                break
    why = "no cgroup v1 memory and pids hierarchies or cgroup v2 mount"
    for plan in candidates:
        try:
            if plan.version == 2:
                delegate_v2(plan.memory, os.getpid())
            CallCgroup(plan, memory_bytes=64 * 2 ** 20, tasks=8).close()
            return plan, ""
        except NotDelegated as err:
            why = str(err)
        except OSError as err:
            why = (f"cannot make a child of {plan.memory} with memory and pids limits "
                   f"({type(err).__name__}: {err.strerror or err})")
    return None, why


class NotDelegated(OSError):
    """cgroup v2 cannot give this process's cgroup's children memory and pids limits (the message says why)."""


LEAF = "thinkrl-trainer"
_RUN_ALONE = ("run the trainer in a cgroup of its own (systemd-run --user --scope -p Delegate=yes thinkrl "
              "train ..., or a container whose cgroup holds only the trainer)")


def delegate_v2(folder: Path, trainer: int) -> None:
    """Enables memory and pids for the children of `folder` (the trainer's
    cgroup v2). A cgroup holding processes may not: where those are the
    trainer (`trainer`, a pid) and what it started, they move first into
    `folder/thinkrl-trainer`; NotDelegated says why where it cannot be done."""
    offered = set((folder / "cgroup.controllers").read_text().split())
    missing = sorted({"memory", "pids"} - offered)
    if missing:
        raise NotDelegated(f"cgroup v2: {folder} is not given the {' and '.join(missing)} controller(s) by "
                           f"its parent (cgroup.controllers: {' '.join(sorted(offered)) or 'none'}); "
                           + _RUN_ALONE)
    if {"memory", "pids"} <= set((folder / "cgroup.subtree_control").read_text().split()):
        return
    inside = [int(p) for p in (folder / "cgroup.procs").read_text().split()]
    if not (folder / "cgroup.type").exists():  # the hierarchy's root: exempt from the rule, nothing moves
        inside = []
    others = [pid for pid in inside if not _descends_from(pid, trainer)]
    if others:
        raise NotDelegated(f"cgroup v2: {folder} holds {len(others)} process(es) besides the trainer and "
                           f"what it started (pid {others[0]}), and v2 gives no controller to the children "
                           f"of a cgroup with processes of its own; " + _RUN_ALONE)
    if inside:
        leaf = folder / LEAF
        leaf.mkdir(exist_ok=True)
        for pid in inside:
            try:
                _write(leaf / "cgroup.procs", pid)
            except ProcessLookupError:
                pass  # exited meanwhile
    _write(folder / "cgroup.subtree_control", "+memory +pids")


def _descends_from(pid: int, ancestor: int) -> bool:
    for _ in range(64):
        if pid == ancestor:
            return True
        try:
            with open(f"/proc/{pid}/stat") as f:
                pid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            return False
        if pid <= 1:
            return pid == ancestor
    return False
