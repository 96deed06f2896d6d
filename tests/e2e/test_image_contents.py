"""The built image holds what requirements.lock says and nothing to install or run more with.

Its venv's distributions are exactly the lock's pins plus the operator; the SBOM the build
wrote lists exactly the lock's pins, under the operator and its version; no file the build
wrote is newer than SOURCE_DATE_EPOCH; and there is no shell, no pip, no apt or dpkg. Runs
where the image is (`make docker-smoke`, and the kind run of CI, which builds it); skipped,
with the reason, without docker, a daemon or the image (E2E_IMAGE, default the Deployment's).
"""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
import tarfile
from collections.abc import Iterator

import pytest

from himitsu_controller import __version__

from . import image_run
from .kubehelp import REPO

IMAGE = os.environ.get("E2E_IMAGE") or image_run.pod_run(image_run.deployment()).image
UNAVAILABLE = image_run.unavailable(IMAGE)
pytestmark = [pytest.mark.e2e, pytest.mark.image,
              pytest.mark.skipif(UNAVAILABLE is not None, reason=UNAVAILABLE or "")]

SBOM = "/opt/venv/share/doc/himitsu-controller/sbom.cdx.json"
CREATED_BY_DOCKER = {".dockerenv", "etc/hostname", "etc/hosts", "etc/resolv.conf"}
DISTRIBUTIONS = ("import importlib.metadata as m, json; print(json.dumps(sorted("
                 "[d.metadata['Name'], d.version] for d in m.distributions())))")


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def locked() -> dict[str, str]:
    pins = re.findall(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;\\]+)",
                      (REPO / "requirements.lock").read_text(), re.MULTILINE)
    return {canonical(name): version for name, version in pins}


def docker(*args: str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run([image_run.DOCKER, *args], capture_output=True, timeout=120,
                          check=True)


@pytest.fixture(scope="module")
def files() -> Iterator[tarfile.TarFile]:
    """The image's file system, as `docker export` of a container never started."""
    cid = docker("create", IMAGE).stdout.decode().strip()
    try:
        exported = docker("export", cid).stdout
    finally:
        docker("rm", cid)
    with tarfile.open(fileobj=io.BytesIO(exported)) as tar:
        yield tar


def test_the_images_venv_holds_exactly_the_locked_packages_and_the_operator() -> None:
    out = docker("run", "--rm", "--network", "none", "--entrypoint", "/opt/venv/bin/python",
                 IMAGE, "-c", DISTRIBUTIONS).stdout
    installed = {canonical(name): version for name, version in json.loads(out)}
    assert installed == {**locked(), "himitsu-controller": __version__}
    assert "kubernetes" not in installed


def test_the_sbom_names_the_operator_and_its_version_and_lists_exactly_the_lock(
        files: tarfile.TarFile) -> None:
    member = files.extractfile(SBOM.lstrip("/"))
    assert member is not None, f"no SBOM at {SBOM}"
    sbom = json.load(member)
    assert sbom["bomFormat"] == "CycloneDX"
    root = sbom["metadata"]["component"]
    assert (root["name"], root.get("version")) == ("himitsu-controller", __version__)
    listed = {canonical(c["name"]): c["version"] for c in sbom["components"]}
    assert listed == locked()
    assert all(c["purl"].startswith("pkg:pypi/") for c in sbom["components"])


def test_the_image_has_no_shell_no_package_manager_and_no_installer(
        files: tarfile.TarFile) -> None:
    names = {m.name.rstrip("/") for m in files.getmembers()}
    programs = {n.rpartition("/")[2] for n in names
                if re.match(r"(usr/)?(local/)?s?bin/[^/]+$", n)}
    assert programs <= {"python", "python3", "python3.11"}, sorted(programs)
    assert {"python3"} <= programs
    installers = [n for n in names if re.search(r"-packages/(pip|setuptools|wheel)(/|$)", n)]
    assert installers == []
    # dpkg's status file stays (scanners read it), as do the packages' copyright files.
    assert not [n for n in names if re.search(r"(^|/)(ensurepip|apt|dpkg)(/|$)", n)
                and not n.startswith(("var/lib/dpkg", "usr/share/doc/"))]


def test_no_file_the_build_wrote_is_newer_than_source_date_epoch(
        files: tarfile.TarFile) -> None:
    # build.sh's SOURCE_DATE_EPOCH: the time of the commit the image is labelled with.
    labels = json.loads(docker("image", "inspect", IMAGE).stdout)[0]["Config"]["Labels"]
    revision = labels["org.opencontainers.image.revision"]
    epoch = int(subprocess.run(["git", "-C", str(REPO), "log", "-1", "--format=%ct", revision],
                               capture_output=True, text=True, check=True).stdout)
    newer = [m.name for m in files.getmembers()
             if m.isfile() and m.mtime > epoch and m.name not in CREATED_BY_DOCKER
             and not m.name.startswith("dev/")]
    assert newer == [], f"{len(newer)} files newer than SOURCE_DATE_EPOCH, e.g. {newer[:3]}"
