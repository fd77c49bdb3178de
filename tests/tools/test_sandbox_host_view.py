"""How the host sees the Python tool's code where the trainer is root, and
the per-call cgroup on cgroup v2: the fallbacks and their messages."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from thinkrl.tools import jail, sandbox
from thinkrl.tools.call_cgroup import LEAF, NotDelegated, delegate_v2

root_only = pytest.mark.skipif(os.geteuid() != 0, reason="needs a root trainer")


def _plan_without_the_drop(monkeypatch, landlock: int) -> jail.JailPlan:
    def refuse():
        raise OSError("unshare(CLONE_NEWUSER) failed (errno 28)")
    monkeypatch.setattr(jail, "nobody_userns", refuse)
    monkeypatch.setattr(jail, "landlock_abi", lambda: landlock)
    return jail.jail_plan.__wrapped__()


@root_only
def test_without_the_drop_or_landlock_a_root_trainer_is_refused(monkeypatch):
    plan = _plan_without_the_drop(monkeypatch, landlock=0)
    assert plan.host_uid == 0 and plan.userns_fd is None
    assert any("host would see the code as uid 0" in line and "no Landlock" in line and "errno 28" in line
               for line in plan.missing), plan.missing


@root_only
def test_without_the_drop_the_host_s_nodes_are_read_only_and_the_start_line_says_so(monkeypatch):
    if jail.landlock_abi() == 0 or jail.jail_plan().missing:
        pytest.skip("needs bwrap, seccomp and Landlock")
    plan = _plan_without_the_drop(monkeypatch, landlock=jail.landlock_abi())
    assert not plan.missing and any("uid 0" in note for note in plan.notes)
    monkeypatch.setattr(sandbox, "jail_plan", lambda: plan)
    code = ("import os, stat\nfor p in ('/dev/null', '/dev/zero', '/proc/meminfo'):\n    try:\n"
            "        os.chmod(p, stat.S_IMODE(os.stat(p).st_mode))\n        print('ESCAPED', p)\n"
            "    except OSError as err:\n        print(p, err.errno)\nprint(open('/proc/self/uid_map').read().split())")
    text = sandbox.run_python(code, sandbox.SandboxLimits(audit_hook=False)).text()
    assert "ESCAPED" not in text and "/dev/null 30" in text and "'0', '1']" in text, text  # EROFS; host uid 0


def _fake_v2(tmp_path: Path, controllers: str, procs: list[int], root: bool = False) -> Path:
    folder = tmp_path / "trainer.scope"
    folder.mkdir()
    if not root:  # only a non-root cgroup has a type
        (folder / "cgroup.type").write_text("domain\n")
    (folder / "cgroup.controllers").write_text(controllers + "\n")
    (folder / "cgroup.subtree_control").write_text("\n")
    (folder / "cgroup.procs").write_text("".join(f"{pid}\n" for pid in procs))
    return folder


def test_v2_moves_the_trainer_into_a_leaf_before_enabling_the_controllers(tmp_path):
    """A file tree standing in for cgroupfs (this machine has cgroup v1): the
    order of writes is what v2 requires; the kernel's side is not exercised."""
    folder = _fake_v2(tmp_path, "cpu memory pids", [os.getpid()])
    delegate_v2(folder, os.getpid())
    assert (folder / LEAF / "cgroup.procs").read_text() == str(os.getpid())
    assert (folder / "cgroup.subtree_control").read_text() == "+memory +pids"


def test_v2_leaves_a_shared_cgroup_alone_and_says_how_to_run_the_trainer(tmp_path):
    folder = _fake_v2(tmp_path, "memory pids", [os.getpid(), 1])
    with pytest.raises(NotDelegated, match=r"holds 1 process\(es\) besides the trainer.*pid 1.*systemd-run"):
        delegate_v2(folder, os.getpid())
    assert not (folder / LEAF).exists() and (folder / "cgroup.subtree_control").read_text() == "\n"


def test_v2_moves_nothing_out_of_the_hierarchy_s_root_which_the_rule_exempts(tmp_path):
    folder = _fake_v2(tmp_path, "memory pids", [os.getpid(), 1], root=True)
    delegate_v2(folder, os.getpid())
    assert not (folder / LEAF).exists() and (folder / "cgroup.subtree_control").read_text() == "+memory +pids"


def test_v2_names_the_controllers_its_parent_does_not_give(tmp_path):
    folder = _fake_v2(tmp_path, "cpu io", [])
    with pytest.raises(NotDelegated, match="not given the memory and pids controller"):
        delegate_v2(folder, os.getpid())
