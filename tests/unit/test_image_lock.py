"""The image installs exactly requirements.lock, every file checked by its hash, and the
lock holds exactly what the operator imports: pyproject.toml's dependencies less
`kubernetes`, and what they depend on. (tests/e2e/test_image_contents.py checks the
built image and its SBOM against the same lock.)"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tomllib
from importlib import metadata
from pathlib import Path

from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[1].parent
sys.path.insert(0, str(ROOT / "hack" / "image"))
from lock_input import LEFT_OUT, image_requirements  # noqa: E402

LOCK = ROOT / "requirements.lock"
TOOLS_LOCK = ROOT / "hack" / "image" / "build-tools.lock"
PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+?)(?:\s*;\s*([^\\]+?))?\s*\\?$")


def pins(lock: Path) -> dict[str, tuple[str, list[str]]]:
    """{canonical name: (version, [sha256 hashes])}, checking the lock's shape on the way."""
    found: dict[str, tuple[str, list[str]]] = {}
    current = None
    for line in lock.read_text().splitlines():
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        if stripped.startswith("--hash="):
            assert current is not None, line
            algorithm, _, digest = stripped.removeprefix("--hash=").rstrip(" \\").partition(":")
            assert algorithm == "sha256" and re.fullmatch(r"[0-9a-f]{64}", digest), line
            found[current][1].append(digest)
            continue
        match = PIN.match(stripped)
        assert match, f"{lock.name}: not an exact pin: {line!r}"
        current = canonicalize_name(match.group(1))
        found[current] = (match.group(2), [])
    for name, (_, hashes) in found.items():
        assert hashes, f"{lock.name}: {name} has no hash"
    return found


def closure(roots: list[Requirement]) -> set[str]:
    """The roots' names and their dependencies' (from the installed metadata), markers
    evaluated for Linux and Python 3.11, no extras."""
    env: dict[str, str] = {str(k): str(v) for k, v in default_environment().items()}
    env.update(sys_platform="linux", platform_system="Linux", python_version="3.11",
               python_full_version="3.11.2", extra="")
    seen: set[str] = set()
    todo = [canonicalize_name(r.name) for r in roots]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        for text in metadata.requires(name) or []:
            requirement = Requirement(text)
            if requirement.marker is None or requirement.marker.evaluate(env):
                todo.append(canonicalize_name(requirement.name))
    return seen


def test_every_locked_package_is_pinned_with_hashes() -> None:
    locked = pins(LOCK)
    assert locked and pins(TOOLS_LOCK)
    assert all(len(hashes) >= 1 for _, hashes in locked.values())


def test_the_lock_is_pyprojects_dependencies_less_kubernetes_and_nothing_more() -> None:
    locked = pins(LOCK)
    roots = [Requirement(r) for r in image_requirements()]
    for requirement in roots:  # each pin satisfies pyproject's range
        version, _ = locked[canonicalize_name(requirement.name)]
        assert requirement.specifier.contains(Version(version), prereleases=True), requirement
    assert set(locked) == closure(roots)
    assert not LEFT_OUT & set(locked)


IMPORTED = r"""
import importlib, json, pkgutil, sys
from importlib import metadata
allowed = set(json.loads(sys.argv[1])) | {"himitsu-controller"}
owners = metadata.packages_distributions()
canonical = lambda d: d.lower().replace("_", "-").replace(".", "-")

class OnlyTheLock:  # as in the image: a package outside the lock is not there
    @staticmethod
    def find_spec(name, path=None, target=None):
        dists = {canonical(d) for d in owners.get(name.partition(".")[0], [])}
        if dists and not dists & allowed:
            raise ModuleNotFoundError(f"not in the lock: {name}", name=name)
        return None

before = set(sys.modules)  # the interpreter's own start (site, .pth hooks) does not count
sys.meta_path.insert(0, OnlyTheLock)
import himitsu_controller
for module in pkgutil.walk_packages(himitsu_controller.__path__, "himitsu_controller."):
    if not module.name.endswith("__main__"):
        importlib.import_module(module.name)
loaded = {name.partition(".")[0] for name in set(sys.modules) - before}
print(json.dumps(sorted({d for top in loaded for d in owners.get(top, [])})))
"""


def test_the_lock_is_what_the_operators_modules_import() -> None:
    # Every module of the package (runtime/client/config.py imports `kubernetes` only
    # inside the out-of-cluster loader), with only the lock's packages importable, as in
    # the image: they all load (the lock suffices), and each locked package is loaded
    # (nothing the operator never imports).
    locked = set(pins(LOCK))
    done = subprocess.run([sys.executable, "-c", IMPORTED, json.dumps(sorted(locked))],
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    imported = {canonicalize_name(d) for d in json.loads(done.stdout)} - {"himitsu-controller"}
    assert imported == locked


def test_the_dockerfile_installs_the_locks_with_hashes_and_the_package_without_deps() -> None:
    lines = [ln for ln in (ROOT / "Dockerfile").read_text().splitlines()
             if not ln.lstrip().startswith("#")]
    commands = "\n".join(lines).replace("\\\n", " ").replace("&&", "\n").splitlines()
    installs = [c for c in commands if re.search(r"\bpip (--python \S+ )?install\b", c)]
    assert len(installs) == 3, installs
    tools, deps, package = (" ".join(i.split()).removeprefix("/opt/tools/bin/")
                            for i in installs)
    assert "--require-hashes" in tools and tools.endswith("-r build-tools.lock")
    assert deps.startswith("pip --python /opt/venv/bin/python install")
    assert "--require-hashes" in deps and "--no-deps" in deps
    assert deps.endswith("-r requirements.lock")
    # The package itself: its wheel only, dependencies never resolved again.
    assert package == "pip --python /opt/venv/bin/python install --no-deps /tmp/wheel/*.whl"
    # The wheel is built with the locked setuptools, nothing fetched for it.
    assert any("--no-build-isolation" in c for c in commands)


def test_the_build_tools_lock_has_the_build_backend_pyproject_asks_for() -> None:
    build = tomllib.loads((ROOT / "pyproject.toml").read_text())["build-system"]["requires"]
    tools = pins(TOOLS_LOCK)
    for text in build:
        requirement = Requirement(text)
        version, _ = tools[canonicalize_name(requirement.name)]
        assert requirement.specifier.contains(Version(version)), requirement
    assert "cyclonedx-bom" in tools
