"""Packages the Python tool's code may import besides the standard library
(numpy, sympy, ...): read-only inside the jail, with the same layers.

Two sources, both named in the tool's config:
- ``packages: [numpy, sympy]``: distributions installed in the trainer's own
  environment, with what they require (sympy brings mpmath). Each top-level
  entry a distribution installed (``numpy/``, ``numpy.libs/``, its
  ``.dist-info``) is mounted read-only at ``/packages/<entry>``: nothing is
  copied, and nothing else of the environment is visible.
- ``packages_dir: /path``: a folder the user prepared (``pip install --target
  /path numpy sympy``), mounted read-only at ``/site``.

Both go on the code's ``sys.path`` after the standard library.
"""

from __future__ import annotations

import importlib.metadata
import os
import re
from dataclasses import dataclass
from functools import lru_cache

from thinkrl.errors import UserError

PACKAGES = "/packages"
SITE = "/site"
_NAME = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)")


@dataclass(frozen=True)
class PackageMounts:
    """Host path -> path in the jail, and the folders the code imports from."""

    mounts: tuple[tuple[str, str], ...]
    import_paths: tuple[str, ...]
    host_import_paths: tuple[str, ...]
    """Where the same packages sit on the host (the unjailed mode imports them there)."""


@lru_cache(maxsize=None)
def package_mounts(packages: tuple[str, ...], packages_dir: str | None) -> PackageMounts:
    """ValueError naming the package or folder (and the fix) where one cannot be had."""
    mounts, host_paths = [], []
    for dist in _with_requirements(packages):
        for entry in sorted({f.parts[0] for f in dist.files or () if f.parts and f.parts[0] != ".."}):
            if entry == "__pycache__":
                continue
            host = os.path.realpath(dist.locate_file(entry))
            if os.path.exists(host):
                mounts.append((host, f"{PACKAGES}/{entry}"))
                host_paths.append(os.path.dirname(host))
    import_paths = [PACKAGES] if mounts else []
    if packages_dir is not None:
        folder = os.path.realpath(os.path.expanduser(packages_dir))
        if not os.path.isdir(folder):
            raise UserError(f"packages_dir={packages_dir!r}: no such folder; make it with "
                             f"`pip install --target {packages_dir} numpy sympy` (or name one that exists)")
        mounts.append((folder, SITE))
        import_paths.append(SITE)
        host_paths.append(folder)
    return PackageMounts(tuple(dict.fromkeys(mounts)), tuple(import_paths), tuple(dict.fromkeys(host_paths)))


def _with_requirements(names: tuple[str, ...]) -> list[importlib.metadata.Distribution]:
    """The named distributions and, transitively, what they require (extras left out)."""
    found: dict[str, importlib.metadata.Distribution] = {}
    todo = [(name, None) for name in names]
    while todo:
        name, wanted_by = todo.pop()
        key = re.sub(r"[-_.]+", "-", name).lower()
        if key in found:
            continue
        try:
            dist = importlib.metadata.distribution(name)
        except importlib.metadata.PackageNotFoundError:
            by = f" (required by {wanted_by})" if wanted_by else ""
            raise UserError(f"packages: {name!r}{by} is not installed in the trainer's environment: "
                             f"pip install {name}, or name a folder of packages with packages_dir") from None
        found[key] = dist
        for requirement in dist.requires or ():
            match = _NAME.match(requirement)
            if match and _needed(requirement):
                todo.append((match.group(1), name))
    return list(found.values())


def _needed(requirement: str) -> bool:
    """Whether a requirement applies without extras, on this interpreter."""
    _, _, marker = requirement.partition(";")
    if not marker.strip():
        return True
    if "extra" in marker:
        return False
    try:
        from packaging.markers import Marker

        return Marker(marker).evaluate()
    except Exception:  # no `packaging`, or a marker it cannot read: take it
        return True
