"""Hostile code against the Python sandbox, as a policy under reward pressure
would write it: the outside review's reproducers and more. Each attack prints
ESCAPED where it gets through; every one must end as one `error:` line for
the model, with the trainer alive and nothing left behind. The attacks run
twice, with the audit hook on (its usual tricks around the hook) and off (as
code that switched it off would be), so the kernel's layers are shown to hold
alone."""

from __future__ import annotations

import dataclasses
import os
import shutil
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from thinkrl.tools.call_cgroup import cgroup_plan
from thinkrl.tools.sandbox import SandboxLimits, run_python

HOOK_ON, HOOK_OFF = SandboxLimits(wall_s=4.0, cpu_s=3), SandboxLimits(wall_s=4.0, cpu_s=3, audit_hook=False)
BOTH = pytest.mark.parametrize("limits", [HOOK_ON, HOOK_OFF], ids=["hook", "no-hook"])

# Around the hook: it resolves a relative path from the cwd, the kernel from dir_fd.
DIR_FD = """
import os
top = os.open('.', os.O_RDONLY)
depth = os.getcwd().count('/')
deep = '/'.join(['d'] * depth)
os.makedirs(deep); os.chdir(deep)
def outside(path, flags=os.O_RDONLY):
    return os.open('../' * depth + path.lstrip('/'), flags, 0o644, dir_fd=top)
"""


def _attack(code: str, limits: SandboxLimits) -> str:
    before = _sandbox_processes()
    result = run_python(textwrap.dedent(code), limits)
    text = result.text()
    assert "ESCAPED" not in text, text
    assert result.error is not None and text.count("error:") == 1, text
    time.sleep(0.05)
    assert _sandbox_processes() <= before, "a process of the call outlived it"
    return text


def _sandbox_processes() -> set[int]:
    """Processes running the marker programs these attacks start."""
    found = set()
    for pid in os.listdir("/proc"):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if b"37.25" in f.read():
                    found.add(int(pid))
        except (FileNotFoundError, ProcessLookupError, PermissionError, NotADirectoryError):
            pass
    return found


@BOTH
def test_a_file_outside_scratch_cannot_be_read_through_dir_fd(tmp_path, limits):
    secret = tmp_path / "secret.txt"
    secret.write_text("the trainer's token")
    _attack(DIR_FD + f"print('ESCAPED', os.read(outside({str(secret)!r}), 100))", limits)


@BOTH
def test_a_file_outside_scratch_cannot_be_written_through_dir_fd(tmp_path, limits):
    target = tmp_path / "checkpoint.bin"
    target.write_text("weights")
    _attack(DIR_FD + f"os.write(outside({str(target)!r}, os.O_WRONLY | os.O_TRUNC), b'x')\nprint('ESCAPED')",
            limits)
    assert target.read_text() == "weights"


def test_rebinding_what_the_hook_calls_does_not_open_files(tmp_path):
    secret = tmp_path / "secret.txt"
    secret.write_text("the trainer's token")
    for rebind in ("import builtins; builtins.isinstance = lambda *a: True",
                   "import os; os.fspath = lambda p: '/scratch/x'",
                   "import posixpath; posixpath.abspath = lambda p: '/scratch/x'"):
        _attack(f"{rebind}\nprint('ESCAPED', open({str(secret)!r}).read())", HOOK_ON)


@BOTH
def test_sqlite_mknod_and_mkfifo_make_no_file_outside_scratch(tmp_path, limits):
    for code in (f"import sqlite3; sqlite3.connect({str(tmp_path / 'evil.db')!r}).execute('create table t(x)')",
                 f"import os; os.mkfifo({str(tmp_path / 'fifo')!r})",
                 f"import os, stat; os.mknod({str(tmp_path / 'node')!r}, stat.S_IFIFO | 0o600)",
                 "import os; os.mknod('dev', 0o600 | 0o020000, os.makedev(1, 3))"):
        _attack(code + "\nprint('ESCAPED')", limits)
    assert sorted(p.name for p in tmp_path.iterdir()) == []


TRAINER = """
import sys
from thinkrl.tools.sandbox import SandboxLimits, run_python
result = run_python(sys.stdin.read(), SandboxLimits(wall_s=4.0, audit_hook=sys.argv[1] == '1'))
print('TRAINER ALIVE', result.text())
"""


@pytest.mark.parametrize("hook", ["1", "0"], ids=["hook", "no-hook"])
@pytest.mark.parametrize("code", [
    "import os, signal\nsignal.pidfd_send_signal(os.pidfd_open(os.getppid()), signal.SIGKILL)",
    "import os, signal\nfor pid in range(1, 4000):\n    try: os.kill(pid, signal.SIGKILL)\n    except OSError: pass\n"
    "os.kill(-1, signal.SIGKILL)\nraise SystemExit('still here')",
    "import os, signal\nos.kill(os.getppid(), signal.SIGSTOP)",
    "import os\nprint('ESCAPED', [p for p in os.listdir('/proc') if p.isdigit()][:50])\n"
    "os.kill(1, 0)\nraise SystemExit('saw only its own')",
], ids=["pidfd-kill-parent", "kill-everything", "stop-parent", "signal-host-pid-1"])
def test_the_trainer_survives_signals_from_the_code(code, hook):
    """Run from a stand-in trainer process, so a hole kills or stops that one, not pytest."""
    done = subprocess.run([sys.executable, "-c", TRAINER, hook], input=code, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0 and "TRAINER ALIVE" in done.stdout, (done.returncode, done.stdout,
                                                                     done.stderr[-2000:])
    answer = done.stdout.split("TRAINER ALIVE", 1)[1]
    assert "error:" in answer and answer.count("error:") == 1
    if "ESCAPED" in answer:  # the sandbox's own /proc: at most its init, the runner and no host process
        pids = eval(answer.split("ESCAPED", 1)[1].split("\n")[0])
        assert len(pids) <= 3, pids


@BOTH
def test_no_process_outlives_the_call(limits):
    attempts = [
        "import subprocess\nsubprocess.Popen(['/bin/sleep', '37.25'])\nprint('ESCAPED')",
        "import os\nif os.fork() == 0:\n    os.execv('/bin/sleep', ['sleep', '37.25'])\nprint('ESCAPED')",
        "import os\nos.posix_spawn('/bin/sleep', ['sleep', '37.25'], {})\nprint('ESCAPED')",
        # a blocked extension module loaded under another name
        "import importlib.machinery as m, importlib.util as u, os, sys\n"
        "spec = m.PathFinder.find_spec('_posixsubprocess')\n"
        "loader = m.ExtensionFileLoader('x._posixsubprocess', spec.origin)\n"
        "ps = u.module_from_spec(u.spec_from_loader('x._posixsubprocess', loader))\n"
        "r, w = os.pipe()\n"
        "ps.fork_exec([b'/bin/sleep', b'37.25'], [b'/bin/sleep'], True, (), None, None, -1, -1, -1, -1, "
        "-1, -1, r, w, True, False, -1, None, None, None, -1, None, False)\nprint('ESCAPED')",
    ]
    for code in attempts:
        _attack(code, limits)


def test_one_call_cannot_touch_another_calls_scratch():
    victim = ("open('answer.txt', 'w').write('42')\nimport time\ntime.sleep(1.5)\n"
              "print(open('answer.txt').read())")
    results = {}
    thread = threading.Thread(target=lambda: results.setdefault("victim", run_python(victim, HOOK_ON)))
    thread.start()
    time.sleep(0.5)
    attacker = DIR_FD + textwrap.dedent("""
        up = os.open('../' * depth, os.O_RDONLY, dir_fd=top)
        hit = []
        def visit(fd, path, level):
            for name in os.listdir(fd):
                if name == 'answer.txt':
                    os.write(os.open(name, os.O_WRONLY | os.O_TRUNC, dir_fd=fd), b'666')
                    hit.append(path)
                elif level < 3:
                    try:
                        visit(os.open(name, os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd), path + '/' + name, level + 1)
                    except OSError:
                        pass
        visit(up, '', 0)
        print('ESCAPED' if any(p != '/scratch' for p in hit) else 'only my own', hit)
        raise SystemExit('done')
        """)
    for limits in (HOOK_ON, HOOK_OFF):
        _attack(attacker, limits)
    thread.join()
    assert results["victim"].text() == "42\n"


def test_the_scratch_folder_has_a_size_cap():
    code = "for i in range(20):\n    open(f'f{i}', 'wb').write(b'x' * 2 ** 20 * 2)\nprint('ESCAPED')"
    text = _attack(code, SandboxLimits(scratch_mb=8, file_mb=4))
    assert "No space left" in text


@BOTH
def test_network_ctypes_and_namespaces_stay_shut(limits):
    for code in ("import socket\nsocket.create_connection(('127.0.0.1', 22), timeout=1)\nprint('ESCAPED')",
                 "import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\n"
                 "assert libc.unshare(0x10000000) == 0 or libc.fork() >= 0, 'refused'\nprint('ESCAPED')",
                 "import ctypes\nassert ctypes.CDLL(None).mount(b'none', b'/scratch', b'tmpfs', 0, None) == 0, "
                 "'refused'\nprint('ESCAPED')",
                 "open('lib.so', 'wb').write(b'\\x7fELF')\nimport ctypes\nctypes.CDLL('./lib.so')\nprint('ESCAPED')"):
        _attack(code, limits)


def test_the_code_sees_no_host_files_and_runs_as_nobody():
    result = run_python("import os\nprint(os.getuid(), os.getcwd(), sorted(os.listdir('.')))", HOOK_OFF)
    assert result.text() == "65534 /scratch ['main.py']\n"
    for path in ("/etc/passwd", "/root", "/home", os.path.dirname(os.path.abspath(__file__)),
                 os.path.expanduser("~")):
        _attack(f"print('ESCAPED', open({path!r}).read(10))", HOOK_OFF)


# Limits the process's own rlimits do not see (the red-team review of 2026-12-03).
needs_cgroup = pytest.mark.skipif(cgroup_plan()[0] is None, reason="no per-call cgroup on this machine")


@BOTH
def test_memory_outside_the_address_space_is_refused(limits):
    """Anonymous files and System V shared memory would hold host memory past memory_mb."""
    for code in ("import os\nfor i in range(64):\n    fd = os.memfd_create('x')\n"
                 "    os.posix_fallocate(fd, 0, 15 * 2 ** 20)\nprint('ESCAPED')",
                 "import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\n"
                 "assert libc.shmget(0, 48 * 2 ** 20, 0o1000 | 0o600) >= 0, 'refused'\nprint('ESCAPED')",
                 "import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\n"
                 "assert libc.msgget(0, 0o1000 | 0o600) >= 0, 'refused'\nprint('ESCAPED')"):
        _attack(code, dataclasses.replace(limits, memory_mb=64))


@needs_cgroup
def test_scratch_inodes_count_against_the_calls_memory():
    """Empty files take no tmpfs bytes but kernel memory: the call's cgroup holds them."""
    code = ("import os\nfor i in range(400000):\n    os.close(os.open('%0200d' % i, os.O_CREAT | os.O_WRONLY))\n"
            "print('ESCAPED')")
    _attack(code, SandboxLimits(wall_s=20.0, cpu_s=20, memory_mb=64, scratch_mb=1))


@pytest.mark.skipif(os.geteuid() == 0 and cgroup_plan()[0] is None,
                    reason="a root host uid is exempt from RLIMIT_NPROC and there is no cgroup")
@BOTH
def test_threads_are_capped_and_a_few_still_work(limits):
    assert run_python("import threading\nt = threading.Thread(target=print, args=(7,))\nt.start()\nt.join()",
                      limits).text() == "7\n"
    code = ("import threading\nthreading.stack_size(32768)\nev = threading.Event()\n"
            "for i in range(500):\n    threading.Thread(target=ev.wait, daemon=True).start()\nprint('ESCAPED')")
    assert "can't start new thread" in _attack(code, limits)


def test_the_code_cannot_reserve_host_disk_through_its_output():
    code = ("import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\n"
            "libc.fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_long, ctypes.c_long]\n"
            "for fd in (1, 2):\n    if libc.fallocate(fd, 1, 0, 2 ** 30) == 0:\n        print('ESCAPED', fd)\n"
            "raise SystemExit('refused')")
    _attack(code, HOOK_OFF)


def test_dev_is_read_only():
    for path in ("/dev/shm/x", "/dev/x"):
        _attack(f"open({path!r}, 'w').write('x')\nprint('ESCAPED')", HOOK_OFF)


SUBREAPER = """
import ctypes, os, sys, time
ctypes.CDLL(None).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER: orphans of the call come here
from thinkrl.tools.sandbox import SandboxLimits, run_python
for _ in range(3):
    assert 'longer than' in run_python('while True: pass', SandboxLimits(wall_s=0.5, audit_hook=False)).text()
time.sleep(0.3)
zombies = 0
for pid in os.listdir('/proc'):
    try:
        stat = open(f'/proc/{pid}/stat').read().rsplit(')', 1)[1].split()
    except (OSError, IndexError):
        continue
    zombies += stat[0] == 'Z' and int(stat[1]) == os.getpid()
print('ZOMBIES', zombies)
"""


def test_a_timed_out_call_leaves_no_zombie_to_a_subreaper():
    """A trainer that is PID 1 of a container (or a subreaper) inherits what a
    killed call orphans; the sandbox's PID 1 is killed first, so bwrap reaps it."""
    done = subprocess.run([sys.executable, "-c", SUBREAPER], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and "ZOMBIES 0" in done.stdout, (done.stdout, done.stderr[-2000:])


SYSTEM_PYTHON = next((p for p in ("/usr/bin/python3.11", "/usr/bin/python3") if os.path.isfile(p)), None)


@pytest.mark.skipif(os.geteuid() != 0 or SYSTEM_PYTHON is None or shutil.which("setpriv") is None,
                    reason="needs root, a world-readable system Python and setpriv")
def test_where_it_can_the_host_sees_the_code_as_nobody_inside_the_calls_cgroup(monkeypatch):
    """The trainer is root and the interpreter is readable by uid 65534: setpriv
    drops to it after the call's cgroup is entered (root's right), so threads
    still work and are capped, and the uid map says 65534 outside too."""
    from thinkrl.tools import jail, sandbox

    plan = dataclasses.replace(jail.jail_plan(), python=SYSTEM_PYTHON, read_only=("/usr",),
                               host_uid=jail.SANDBOX_UID, setpriv=shutil.which("setpriv"))
    monkeypatch.setattr(sandbox, "jail_plan", lambda: plan)
    seen = []

    def host_uids():  # the runner's real uids as the host sees them, while the code sleeps
        time.sleep(0.6)
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    if b"/sandbox/sandbox_runner.py" not in f.read():
                        continue
                with open(f"/proc/{pid}/status") as f:
                    seen.extend(line.split()[1] for line in f if line.startswith("Uid:"))
            except OSError:  # gone meanwhile
                pass
    watcher = threading.Thread(target=host_uids)
    watcher.start()
    assert run_python("import time\ntime.sleep(1.2)\nprint('slept')", HOOK_ON).text() == "slept\n"
    watcher.join()
    assert seen and set(seen) == {"65534"}, seen  # bwrap and the runner: nobody on the host
    assert run_python("import threading\nt = threading.Thread(target=print, args=(7,))\nt.start()\nt.join()",
                      HOOK_ON).text() == "7\n"
    if cgroup_plan()[0] is not None:
        code = ("import threading\nthreading.stack_size(32768)\nev = threading.Event()\n"
                "for i in range(500):\n    threading.Thread(target=ev.wait, daemon=True).start()\nprint('ESCAPED')")
        assert "can't start new thread" in _attack(code, HOOK_ON)
