"""numpy, sympy (or a folder the user prepared) in the Python tool: importable,
read-only, nothing else of the trainer's environment visible, the same
layers."""

from __future__ import annotations

import os
import textwrap

import pytest

from thinkrl.tools.jail import jail_plan
from thinkrl.tools.sandbox import PythonTool, SandboxLimits, run_python
from thinkrl.tools.sandbox_packages import package_mounts

pytest.importorskip("numpy")
pytest.importorskip("sympy")
needs_jail = pytest.mark.skipif(bool(jail_plan().missing), reason="no kernel sandbox on this machine")
MATH = SandboxLimits(packages=("numpy", "sympy"), wall_s=20.0, cpu_s=15)
BOTH = pytest.mark.parametrize("limits", [MATH, SandboxLimits(**{**MATH.__dict__, "audit_hook": False})],
                               ids=["hook", "no-hook"])


def test_a_package_brings_what_it_requires_and_nothing_else():
    mounts = package_mounts(("sympy",), None)
    inside = {jail for _, jail in mounts.mounts}
    assert {"/packages/sympy", "/packages/mpmath"} <= inside and mounts.import_paths == ("/packages",)
    assert not any("numpy" in path or "torch" in path for path in inside)


def test_an_unknown_package_or_folder_is_named_with_the_fix(tmp_path):
    with pytest.raises(ValueError, match="'no-such-pkg' is not installed.*pip install no-such-pkg"):
        package_mounts(("no-such-pkg",), None)
    with pytest.raises(ValueError, match="packages_dir=.*no such folder.*pip install --target"):
        package_mounts((), str(tmp_path / "absent"))
    with pytest.raises(ValueError, match="give a list of package names"):
        SandboxLimits(packages="numpy")


@needs_jail
@BOTH
def test_numpy_and_sympy_compute_in_the_jail(limits):
    code = """
    import numpy as np, sympy as sp
    x = sp.symbols('x')
    print(np.linalg.solve([[2, 1], [1, 3]], [3, 5]).round(3).tolist(), sp.solve(x**2 - 5*x + 6, x),
          sp.Rational(1, 3) + sp.Rational(1, 6), sp.factorint(360))
    """
    result = run_python(textwrap.dedent(code), limits)
    assert result.text().strip() == "[0.8, 1.4] [2, 3] 1/2 {2: 3, 3: 2, 5: 1}", result.text()


@needs_jail
@BOTH
def test_the_packages_are_read_only_and_the_rest_of_the_environment_is_absent(limits):
    code = """
    import os, numpy
    for what, call in [('write', lambda: open(os.path.join(os.path.dirname(numpy.__file__), 'x.py'), 'w')),
                       ('torch', lambda: __import__('torch')), ('thinkrl', lambda: __import__('thinkrl'))]:
        try:
            call()
            print('ESCAPED', what)
        except (OSError, ImportError) as err:
            print(what, type(err).__name__)
    """
    text = run_python(textwrap.dedent(code), limits).text()
    assert "ESCAPED" not in text and "torch ModuleNotFoundError" in text, text


@needs_jail
def test_a_folder_the_user_prepared_is_importable(tmp_path):
    folder = tmp_path / "site"
    (folder / "mylib").mkdir(parents=True)
    (folder / "mylib" / "__init__.py").write_text("def answer():\n    return 42\n")
    for path in (tmp_path, folder, folder / "mylib"):
        os.chmod(path, 0o755)
    tool = PythonTool({"packages_dir": str(folder)})
    assert tool.execute({"code": "import mylib\nprint(mylib.answer())"}) == "42\n"


@pytest.mark.skipif(os.geteuid() != 0 or jail_plan().host_uid != 65534, reason="needs a root trainer that drops")
def test_a_folder_the_code_cannot_read_is_refused_at_start(tmp_path):
    folder = tmp_path / "closed"
    folder.mkdir(mode=0o700)
    with pytest.raises(ValueError, match=r"runs as uid 65534.*chmod -R o\+rX"):
        PythonTool({"packages_dir": str(folder)})
