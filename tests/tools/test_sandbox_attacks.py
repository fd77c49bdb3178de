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
    for path in ("/etc/shadow", "/etc/hostname", "/root", "/home", os.path.dirname(os.path.abspath(__file__)),
                 os.path.expanduser("~")):
        _attack(f"print('ESCAPED', open({path!r}).read(10))", HOOK_OFF)
    # /etc holds the jail's own two lines of who 65534 is, nothing of the host's
    own = run_python("print(open('/etc/passwd').read(), end='')", HOOK_OFF)
    assert own.text() == "nobody:x:65534:65534:nobody:/scratch:/usr/sbin/nologin\n", own.text()


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


def test_dev_is_read_only_but_for_a_small_shm_of_the_call_s_own():
    _attack("open('/dev/x', 'w').write('x')\nprint('ESCAPED')", HOOK_OFF)
    # /dev/shm: a tmpfs of 1 MiB made for the call (POSIX semaphores), not the host's
    _attack("open('/dev/shm/x', 'wb').write(b'x' * 2 ** 21)\nprint('ESCAPED')", HOOK_OFF)
    assert run_python("import os\nprint(os.listdir('/dev/shm'))", HOOK_OFF).text() == "[]\n"


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


@pytest.mark.skipif(os.geteuid() != 0, reason="needs a root trainer")
def test_a_root_trainer_runs_the_code_as_nobody_on_the_host_inside_the_calls_cgroup():
    """The trainer is root and its Python may sit where only root can pass (a
    pyenv under /root here): bwrap mounts as root of a namespace where 0 and
    65534 are the host's own, the first stage drops to 65534, so threads still
    work and are capped, and the host sees nobody."""
    from thinkrl.tools import jail

    plan = jail.jail_plan()
    assert plan.host_uid == jail.SANDBOX_UID and plan.userns_fd is not None, plan.notes
    seen = []

    def host_uids():  # the runner's real uids as the host sees them, while the code sleeps
        time.sleep(0.6)
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    argv = f.read().split(b"\0")
                if b"/sandbox/sandbox_runner.py" not in argv[:6]:  # the runner, not bwrap (root) naming it
                    continue
                with open(f"/proc/{pid}/status") as f:
                    seen.extend(line.split()[1] for line in f if line.startswith("Uid:"))
            except OSError:  # gone meanwhile
                pass
    watcher = threading.Thread(target=host_uids)
    watcher.start()
    assert run_python("import time\ntime.sleep(1.2)\nprint('slept')", HOOK_ON).text() == "slept\n"
    watcher.join()
    assert seen and set(seen) == {"65534"}, seen  # the code's process: nobody on the host
    assert run_python("import threading\nt = threading.Thread(target=print, args=(7,))\nt.start()\nt.join()",
                      HOOK_ON).text() == "7\n"
    if cgroup_plan()[0] is not None:
        code = ("import threading\nthreading.stack_size(32768)\nev = threading.Event()\n"
                "for i in range(500):\n    threading.Thread(target=ev.wait, daemon=True).start()\nprint('ESCAPED')")
        assert "can't start new thread" in _attack(code, HOOK_ON)


# The second red-team round: as host root (a root trainer whose Python sits
# where only root can pass), the code owned kernel objects every namespace
# shares. Each probe uses the right without changing anything (a mode the file
# already has, an owner it already has): where the call goes through, the
# right exists and the probe prints ESCAPED.
SAME_MODE = """
import os, stat
def same_mode(path, **kw):
    os.chmod(path, stat.S_IMODE(os.stat(path, **kw).st_mode), **kw)
    print('ESCAPED chmod', path)
"""


def _held(code: str, limits: SandboxLimits) -> str:
    text = run_python(textwrap.dedent(code), limits).text()
    assert "ESCAPED" not in text, text
    return text


@BOTH
@pytest.mark.parametrize("path", ["/proc/meminfo", "/proc/sys/kernel/core_pattern", "/proc/sys/vm/overcommit_memory",
                                  "/dev/null", "/dev/zero", "/dev/urandom", "/dev/tty"])
def test_a_host_object_s_mode_cannot_be_changed(path, limits):
    _held(SAME_MODE + f"same_mode({path!r})", limits)


@BOTH
def test_a_proc_entry_s_mode_cannot_be_changed_through_a_dir_fd(limits):
    _held(SAME_MODE + "top = os.open('/proc', os.O_RDONLY)\nsame_mode('meminfo', dir_fd=top)", limits)


@BOTH
def test_standard_input_is_not_a_host_node(limits):
    code = ("import os, stat\nst = os.fstat(0)\nprint('ESCAPED stdin is a device' if stat.S_ISCHR(st.st_mode) "
            "else 'a pipe')\nprint(repr(os.read(0, 10)))\nos.fchmod(0, stat.S_IMODE(st.st_mode))\n"
            "print('ESCAPED fchmod 0')")
    assert "a pipe\nb''" in _held(code, limits)


@BOTH
def test_proc_and_proc_sys_are_read_only_mounts(limits):
    code = ("import os\nfor path in ('/proc', '/proc/sys', '/proc/sys/kernel'):\n"
            "    if not os.statvfs(path).f_flag & os.ST_RDONLY:\n        print('ESCAPED writable', path)\n"
            "print('checked')")
    assert "checked" in _held(code, limits)


@BOTH
@pytest.mark.parametrize("path", ["/proc/kpageflags", "/proc/slabinfo", "/proc/timer_list"])
def test_root_only_kernel_files_are_unreadable(path, limits):
    if not os.path.exists(path):
        pytest.skip(f"{path} is not in this kernel")
    _held(f"data = open({path!r}, 'rb').read(64)\nprint('ESCAPED read' if data.strip(b'0 \\n') else 'zeros')",
          limits)


@BOTH
def test_owners_and_extended_attributes_cannot_be_set(limits):
    code = """
    import os
    open('own.txt', 'w').write('x')
    for name, call in [('chown', lambda: os.chown('own.txt', os.getuid(), os.getgid())),
                       ('chown /dev/null', lambda: os.chown('/dev/null', 0, 0)),
                       ('setxattr', lambda: os.setxattr('own.txt', 'user.k', b'v'))]:
        try:
            call()
            print('ESCAPED', name)
        except OSError as err:
            print(name, err.errno)
    """
    assert "chown 1\n" in _held(code, limits)  # EPERM from seccomp, not a mode check


NUMBERED = """
import ctypes, errno
libc = ctypes.CDLL(None, use_errno=True)
def call(number, *args):
    ctypes.set_errno(0)
    result = libc.syscall(number, *args)
    return result, ctypes.get_errno()
for name, number, refused in [('modify_ldt', 154, errno.EPERM), ('sync', 162, errno.EPERM),
                              ('syncfs', 306, errno.EPERM), ('statmount', 457, errno.EPERM),
                              ('listmount', 458, errno.EPERM), ('setxattrat', 463, errno.EPERM),
                              ('removexattrat', 466, errno.EPERM), ('open_tree_attr', 467, errno.EPERM),
                              ('file_setattr', 469, errno.EPERM), ('future', 490, errno.ENOSYS)]:
    result, err = call(number, 0, 0, 0, 0, 0)
    print(name, 'refused' if (result, err) == (-1, refused) else f'ESCAPED {result} {err}')
"""


def test_calls_newer_than_libseccomp_and_global_ones_are_refused():
    """Hook off (ctypes is the hook's first refusal): x86-64's numbers."""
    if os.uname().machine != "x86_64":
        pytest.skip("the probe names x86-64's numbers")
    assert _held(NUMBERED, HOOK_OFF).count("refused") == 10


def test_only_fds_0_to_2_reach_the_code_and_no_capability_is_left_in_any_set():
    code = ("import os\nprint(sorted(os.listdir('/proc/self/fd')))\n"
            "status = dict(line.split(':', 1) for line in open('/proc/self/status'))\n"
            "print([k for k in ('CapInh', 'CapPrm', 'CapEff', 'CapBnd', 'CapAmb') if int(status[k], 16)])\n"
            "print(open('/proc/1/cmdline').read().split(chr(0))[0])")
    # listdir opens the folder itself: its fd is the fourth
    assert run_python(code, HOOK_OFF).text().splitlines() == ["['0', '1', '2', '3']", "[]", "bwrap"]


def test_one_call_s_threads_and_queued_signals_do_not_starve_another():
    """Calls share the namespace's uid: per-user counts (RLIMIT_NPROC,
    queued signals) would be pooled; a cgroup per call holds the threads."""
    if cgroup_plan()[0] is None:
        pytest.skip("no cgroup per call here: RLIMIT_NPROC holds the threads, pooled across calls")
    hog = ("import threading, time, signal\nthreading.stack_size(65536)\nev = threading.Event()\nn = 0\ntry:\n"
           "    for _ in range(29):\n        threading.Thread(target=ev.wait, daemon=True).start(); n += 1\n"
           "except RuntimeError:\n    pass\nsignal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGRTMIN})\n"
           "sent = 0\ntry:\n    for _ in range(1000):\n        signal.raise_signal(signal.SIGRTMIN); sent += 1\n"
           "except OSError:\n    pass\nprint('hog', n, sent)\ntime.sleep(2)")
    results = {}
    hogging = threading.Thread(target=lambda: results.update(hog=run_python(hog, HOOK_OFF).text()))
    hogging.start()
    time.sleep(0.8)
    other = run_python("import threading\nthreading.stack_size(65536)\nev = threading.Event()\nfor _ in range(25):\n"
                       "    threading.Thread(target=ev.wait, daemon=True).start()\nprint('ok')", HOOK_OFF)
    hogging.join()
    assert other.text() == "ok\n", other.text()
    assert results["hog"].startswith("hog 29"), results
