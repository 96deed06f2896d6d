"""Static checks of deploy/ and the Dockerfile: the pieces must agree with each other.

Manifests, the image and the CLI are written in three languages and nothing compiles
them together: a port renamed in one place, a flag the CLI no longer knows, a user id
that differs between the image and the securityContext, or an RBAC verb added "just in
case" only fails on a live cluster, if at all. Each test here ties two of them together.
(The CRD and samples are checked in test_deploy_crd.py.)
"""

from __future__ import annotations

import fnmatch
import functools
import json
import re
import shlex
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml

import himitsu_controller

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
NAMESPACE = "himitsu-system"
PLACEHOLDER = "REPLACE-WITH-YOUR-HIMITSU-API-URLS"  # cli.API_URLS_PLACEHOLDER, checked below
_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)

# Every (apiGroup, resource, verb) the operator is granted, and nothing else. Why each
# one is needed is written next to the rule in deploy/rbac/role.yaml, and
# tests/e2e/test_rbac_verbs_are_each_needed.py shows each one is: without it, the code
# path that uses it gets a 403 from a real apiserver.
OPERATOR_GRANTS = {
    *{("himitsu.io", "himitsusecrets", v) for v in ("list", "watch")},
    ("himitsu.io", "himitsusecrets/status", "patch"),
    ("himitsu.io", "himitsusecrets/finalizers", "update"),
    *{("", "secrets", v) for v in ("get", "list", "watch", "create", "update", "delete")},
    ("", "events", "create"),
}
# Only with rollout restarts enabled (deploy/components/rollout-restarts).
RESTART_GRANTS = {("apps", r, v) for r in ("deployments", "statefulsets", "daemonsets")
                  for v in ("get", "patch")}
LEADER_ELECTION_GRANTS = {
    *{("coordination.k8s.io", "leases", v) for v in ("get", "create", "update")},
}


@functools.cache
def _docs_cached(relative: str) -> tuple[Any, ...]:
    with (ROOT / relative).open(encoding="utf-8") as fh:
        return tuple(d for d in yaml.load_all(fh, Loader=_LOADER) if d is not None)


def docs(relative: str) -> tuple[Any, ...]:
    """Parsed YAML documents of a file, shared between tests: read, never change."""
    return _docs_cached(relative)


def one(relative: str, kind: str, name: str | None = None) -> Any:
    found = [d for d in docs(relative) if d["kind"] == kind
             and (name is None or d["metadata"]["name"] == name)]
    assert len(found) == 1, f"{relative}: expected one {kind} {name or ''}, got {len(found)}"
    return found[0]


def deployment() -> Any:
    return one("deploy/manager/manager.yaml", "Deployment")


def container() -> Any:
    (manager,) = deployment()["spec"]["template"]["spec"]["containers"]
    return manager


def grants(rules: list[Any]) -> set[tuple[str, str, str]]:
    return {(g, r, v) for rule in rules for g in rule["apiGroups"]
            for r in rule["resources"] for v in rule["verbs"]}


def parse_dockerfile(text: str) -> list[list[tuple[str, str]]]:
    """(INSTRUCTION, arguments) per build stage; continuation lines joined."""
    stages: list[list[tuple[str, str]]] = []
    pending = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        instruction, _, rest = (pending + line).partition(" ")
        pending = ""
        if instruction.upper() == "FROM":
            stages.append([])
        if stages:
            stages[-1].append((instruction.upper(), rest.strip()))
    return stages


def final_stage(instruction: str) -> list[str]:
    text = (ROOT / "Dockerfile").read_text(encoding="utf-8")
    return [args for instr, args in parse_dockerfile(text)[-1] if instr == instruction]


def bind_port(flag: str) -> int:
    (value,) = [a.split("=", 1)[1] for a in container()["args"] if a.startswith(f"{flag}=")]
    return int(value.rsplit(":", 1)[1])


def container_port(name: str) -> int:
    (port,) = [p["containerPort"] for p in container()["ports"] if p["name"] == name]
    return int(port)


# ---- every file ----------------------------------------------------------------------


def test_every_manifest_parses_and_names_itself() -> None:
    files = sorted(DEPLOY.rglob("*.yaml"))
    assert len(files) >= 15
    for path in files:
        for doc in docs(str(path.relative_to(ROOT))):
            assert doc["apiVersion"] and doc["kind"], path
            if doc["kind"] not in {"Kustomization", "Component"}:
                assert doc["metadata"]["name"], path
                labels = doc["metadata"].get("labels", {})
                if doc["kind"] != "HimitsuSecret":
                    assert labels.get("app.kubernetes.io/part-of") == "himitsu", path


# ---- RBAC ------------------------------------------------------------------------------


def test_cluster_role_is_least_privilege() -> None:
    role = one("deploy/rbac/role.yaml", "ClusterRole", "himitsu-operator")
    assert grants(role["rules"]) == OPERATOR_GRANTS
    text = json.dumps(role["rules"])
    assert "*" not in text
    assert all(set(rule) == {"apiGroups", "resources", "verbs"} for rule in role["rules"])


def test_namespaced_roles_grant_the_same_as_the_cluster_roles() -> None:
    for cluster_file, role_file in [
            ("deploy/rbac/role.yaml", "deploy/namespaced/role.yaml"),
            ("deploy/components/rollout-restarts/role.yaml",
             "deploy/components/rollout-restarts-namespaced/role.yaml")]:
        cluster = one(cluster_file, "ClusterRole")
        role = one(role_file, "Role")
        assert role["rules"] == cluster["rules"], role_file
        assert role["metadata"]["name"] == cluster["metadata"]["name"]
        binding = one(role_file.replace("role.yaml", "role_binding.yaml"), "RoleBinding")
        assert binding["metadata"]["namespace"] == role["metadata"]["namespace"]
        assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                                      "name": role["metadata"]["name"]}


def test_rollout_restart_role_grants_get_and_patch_on_workloads_only() -> None:
    role = one("deploy/components/rollout-restarts/role.yaml", "ClusterRole")
    assert grants(role["rules"]) == RESTART_GRANTS
    binding = one("deploy/components/rollout-restarts/role_binding.yaml", "ClusterRoleBinding")
    assert binding["roleRef"]["name"] == role["metadata"]["name"]


def test_leader_election_role() -> None:
    role = one("deploy/rbac/leader_election_role.yaml", "Role")
    assert role["metadata"]["namespace"] == NAMESPACE
    assert grants(role["rules"]) == LEADER_ELECTION_GRANTS
    # get and update for the one Lease; create cannot be narrowed by name.
    by_verbs = {tuple(r["verbs"]): r.get("resourceNames") for r in role["rules"]}
    assert by_verbs == {("get", "update"): ["himitsu-operator.himitsu.io"], ("create",): None}
    from himitsu_controller.cli import LEASE_NAME  # noqa: PLC0415

    assert by_verbs[("get", "update")] == [LEASE_NAME]


@pytest.mark.parametrize(
    ("relative", "kind"),
    [("deploy/rbac/service_account.yaml", "ServiceAccount"),
     ("deploy/rbac/role_binding.yaml", "ClusterRoleBinding"),
     ("deploy/rbac/leader_election_role.yaml", "Role"),
     ("deploy/rbac/leader_election_role_binding.yaml", "RoleBinding")],
)
def test_manager_bundle_holds_the_same_rbac_objects(relative: str, kind: str) -> None:
    (piece,) = docs(relative)
    assert one("deploy/manager/manager.yaml", kind, piece["metadata"]["name"]) == piece


def test_bindings_point_at_the_roles_and_the_service_account() -> None:
    bundle = "deploy/manager/manager.yaml"
    account = one(bundle, "ServiceAccount")
    subject = {"kind": "ServiceAccount", "name": account["metadata"]["name"],
               "namespace": account["metadata"]["namespace"]}
    assert deployment()["spec"]["template"]["spec"]["serviceAccountName"] == subject["name"]
    cluster_role = one("deploy/rbac/role.yaml", "ClusterRole")
    for kind, role_kind, role_name in [
        ("ClusterRoleBinding", "ClusterRole", cluster_role["metadata"]["name"]),
        ("RoleBinding", "Role", one(bundle, "Role")["metadata"]["name"]),
    ]:
        binding = one(bundle, kind)
        assert binding["subjects"] == [subject]
        assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io",
                                      "kind": role_kind, "name": role_name}


# ---- the manager bundle ----------------------------------------------------------------


def test_bundle_is_self_contained_in_one_namespace() -> None:
    bundle = docs("deploy/manager/manager.yaml")
    assert sorted(d["kind"] for d in bundle) == sorted([
        "Namespace", "ServiceAccount", "ClusterRoleBinding", "Role", "RoleBinding",
        "Service", "PodDisruptionBudget", "Deployment",
    ])
    assert one("deploy/manager/manager.yaml", "Namespace")["metadata"]["name"] == NAMESPACE
    for doc in bundle:
        if doc["kind"] not in {"Namespace", "ClusterRoleBinding"}:
            assert doc["metadata"]["namespace"] == NAMESPACE, doc["kind"]


def test_deployment_runs_two_leader_elected_replicas() -> None:
    spec = deployment()["spec"]
    assert spec["replicas"] == 2
    assert "--leader-elect" in container()["args"]
    assert "--log-format=json" in container()["args"]
    assert container()["image"] == (
        f"ghcr.io/himitsu-io/himitsu-controller:{himitsu_controller.__version__}")
    assert container()["imagePullPolicy"] == "IfNotPresent"
    assert container()["env"] == [
        {"name": "POD_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
        {"name": "HIMITSU_API_URLS", "value": PLACEHOLDER},
    ]
    assert container()["resources"] == {"requests": {"cpu": "50m", "memory": "96Mi"},
                                        "limits": {"cpu": "500m", "memory": "256Mi"}}
    affinity = spec["template"]["spec"]["affinity"]["podAntiAffinity"]
    (term,) = affinity["preferredDuringSchedulingIgnoredDuringExecution"]
    assert term["podAffinityTerm"]["topologyKey"] == "kubernetes.io/hostname"
    assert term["podAffinityTerm"]["labelSelector"] == spec["selector"]


def test_selectors_match_the_pods() -> None:
    bundle = "deploy/manager/manager.yaml"
    pod_labels = deployment()["spec"]["template"]["metadata"]["labels"]
    selectors = [deployment()["spec"]["selector"]["matchLabels"],
                 one(bundle, "Service")["spec"]["selector"],
                 one(bundle, "PodDisruptionBudget")["spec"]["selector"]["matchLabels"]]
    for selector in selectors:
        assert selector.items() <= pod_labels.items()


def test_ports_probes_and_scrape_annotations_agree() -> None:
    metrics, probes = bind_port("--metrics-bind-address"), bind_port("--health-probe-bind-address")
    assert (container_port("metrics"), container_port("probes")) == (metrics, probes)
    assert container()["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "probes"}
    assert container()["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "probes"}
    service = one("deploy/manager/manager.yaml", "Service")
    assert service["spec"]["ports"] == [
        {"name": "metrics", "port": metrics, "targetPort": "metrics", "protocol": "TCP"}]
    scrape = {"prometheus.io/scrape": "true", "prometheus.io/port": str(metrics),
              "prometheus.io/path": "/metrics"}
    for annotated in (service["metadata"], deployment()["spec"]["template"]["metadata"]):
        assert scrape.items() <= annotated["annotations"].items()
    (monitor,) = docs("deploy/prometheus/servicemonitor.yaml")
    assert monitor["spec"]["selector"]["matchLabels"].items() <= (
        service["metadata"]["labels"].items())
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": [NAMESPACE]}
    (endpoint,) = monitor["spec"]["endpoints"]
    assert (endpoint["port"], endpoint["path"], endpoint["interval"]) == (
        "metrics", "/metrics", "30s")


def test_pod_is_locked_down_and_writes_only_tmp() -> None:
    pod = deployment()["spec"]["template"]["spec"]
    expected = {"runAsNonRoot": True, "runAsUser": 65532, "runAsGroup": 65532,
                "seccompProfile": {"type": "RuntimeDefault"}}
    assert pod["securityContext"] == expected
    assert container()["securityContext"] == {
        **expected, "readOnlyRootFilesystem": True, "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]}}
    (mount,) = container()["volumeMounts"]
    (volume,) = pod["volumes"]
    assert mount["mountPath"] == "/tmp"
    assert volume["name"] == mount["name"]
    assert "emptyDir" in volume


# ---- the Dockerfile, against the manifest and the package --------------------------------


def test_image_user_ports_and_entrypoint_match_the_deployment() -> None:
    (user,) = final_stage("USER")
    uid, gid = (int(part) for part in user.split(":"))
    context = container()["securityContext"]
    assert (uid, gid) == (context["runAsUser"], context["runAsGroup"])
    (expose,) = final_stage("EXPOSE")
    assert {int(p) for p in expose.split()} == {p["containerPort"] for p in container()["ports"]}
    (entrypoint,) = final_stage("ENTRYPOINT")
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    (script,) = pyproject["project"]["scripts"]
    assert json.loads(entrypoint) == [f"/opt/venv/bin/{script}"]
    assert "command" not in container()


def test_image_is_the_trimmed_base_plus_a_venv_and_never_writes_bytecode() -> None:
    text = (ROOT / "Dockerfile").read_text(encoding="utf-8")
    stages = parse_dockerfile(text)
    assert len(stages) == 3
    # Registry builds take the base by digest (OFFLINE=1 passes a local one instead).
    base = re.search(r"^ARG PYTHON_IMAGE=(\S+)$", text, re.MULTILINE)
    assert base is not None
    assert re.fullmatch(r"python:3\.11-slim-bookworm@sha256:[0-9a-f]{64}", base.group(1))
    assert [args for instr, args in stages[0] if instr == "FROM"] == [
        "${PYTHON_IMAGE} AS builder"]
    assert [args for instr, args in stages[1] if instr == "FROM"] == [
        "${PYTHON_IMAGE} AS runtime"]
    assert [args for instr, args in stages[2] if instr == "FROM"] == ["scratch"]
    for stage in stages[:2]:  # pip, compileall and the SBOM see the commit's time
        assert ("ARG", "SOURCE_DATE_EPOCH") in stage
    builder_runs = [a for i, a in stages[0] if i == "RUN"]
    assert any("--no-deps /tmp/wheel/" in a and "/opt/venv" in a for a in builder_runs)
    # Only the venv crosses from the builder (no source tree, wheel or tooling), and the
    # trimmed runtime tree into the final image, by COPY: buildah's layer cache would
    # reuse a RUN whose bind-mounted files changed.
    assert [a for i, a in stages[1] if i == "COPY"] == ["--from=builder /opt/venv /opt/venv"]
    assert final_stage("COPY") == ["--from=runtime / /"]
    assert final_stage("RUN") == []  # nothing runs in the final image: it has no shell
    # The runtime stage's last step needs no shell: it ran after the shell was removed.
    assert [a for i, a in stages[1] if i == "RUN"][-1].startswith("[")
    env = dict(pair.split("=", 1) for args in final_stage("ENV") for pair in shlex.split(args))
    assert env["PYTHONDONTWRITEBYTECODE"] == "1"
    assert env["PYTHONUNBUFFERED"] == "1"
    assert env["PATH"].startswith("/opt/venv/bin:")


def test_dockerignore_lets_through_what_the_build_copies() -> None:
    rules = [line.strip() for line in (ROOT / ".dockerignore").read_text().splitlines()
             if line.strip() and not line.startswith("#")]

    def sent(path: str) -> bool:
        included = True
        for rule in rules:
            negate, pattern = rule.startswith("!"), rule.lstrip("!").rstrip("/")
            parts = path.split("/")
            prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
            if any(fnmatch.fnmatch(p, pattern) for p in prefixes):
                included = negate
        return included

    text = (ROOT / "Dockerfile").read_text(encoding="utf-8")
    copied = [word for instr, args in parse_dockerfile(text)[0] if instr == "COPY"
              for word in args.split()[:-1]]
    assert "requirements.lock" in copied and "hack/image/build-tools.lock" in copied
    readme = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["readme"]
    assert readme in copied, "pyproject.toml's readme is needed to build the wheel"
    for source in copied:
        assert sent(source.rstrip("/")), source
    assert sent("src/himitsu_controller/cli.py")
    for private in (".venv/bin/python", ".git/config", "tests/unit/test_deploy.py",
                    "hack/kube/bin/kube-apiserver", "src/himitsu_controller/__pycache__"):
        assert not sent(private), private


# ---- the manifest against the CLI --------------------------------------------------------


def test_manifest_args_are_flags_the_cli_documents() -> None:
    # Imported here, not at the top: a CLI that fails to import fails this test only.
    from himitsu_controller.cli import build_parser  # noqa: PLC0415

    parser = build_parser()
    args = container()["args"]
    parsed, unknown = parser.parse_known_args(args)
    assert unknown == []
    help_text = parser.format_help()
    for arg in args:
        assert arg.split("=", 1)[0] in help_text
    assert parsed.leader_elect is True
    # The kubelet's SIGKILL must come after the operator's own drain deadline.
    grace = deployment()["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
    assert parsed.graceful_shutdown_timeout < grace


def expanded_args(env: dict[str, str] | None = None) -> list[str]:
    """The container's args as the kubelet passes them: ``$(VAR)`` from the container's env."""
    values = {e["name"]: e["value"] for e in container()["env"] if "value" in e}
    values.update(env or {})
    return [re.sub(r"\$\((\w+)\)", lambda m: values.get(m[1], m[0]), a)
            for a in container()["args"]]


def test_shipped_deployment_requires_the_himitsu_urls_and_refuses_plain_http() -> None:
    from himitsu_controller import cli  # noqa: PLC0415

    assert cli.API_URLS_PLACEHOLDER == PLACEHOLDER
    assert "--allowed-api-urls=$(HIMITSU_API_URLS)" in container()["args"]
    assert "--allow-insecure-http" not in container()["args"]
    parsed = cli.build_parser().parse_args(expanded_args())
    assert parsed.allowed_api_urls == PLACEHOLDER
    assert parsed.allow_insecure_http is False


@pytest.mark.timeout(60)
def test_the_operator_refuses_to_start_with_the_placeholder_and_says_what_to_do(
    tmp_path: Path,
) -> None:
    """Left as shipped, the pod fails at once with one line naming the fix, before it
    even looks for a cluster (the kubeconfig here does not exist)."""
    result = subprocess.run(
        [sys.executable, "-m", "himitsu_controller", *expanded_args(),
         "--kubeconfig", str(tmp_path / "none")],
        capture_output=True, text=True, timeout=60, check=False, cwd=ROOT)
    assert result.returncode == 1
    (line,) = [ln for ln in result.stderr.splitlines() if "error:" in ln]
    assert PLACEHOLDER in line and "HIMITSU_API_URLS" in line and "make deploy" in line


def _make_deploy(tmp_path: Path, *variables: str) -> tuple[subprocess.CompletedProcess[str],
                                                           Path]:
    """`make deploy` with a kubectl stand-in: `kustomize` prints the manager bundle,
    `apply -f -` keeps what it was given."""
    applied = tmp_path / "applied.yaml"
    stub = tmp_path / "kubectl"
    stub.write_text(f"""#!/bin/sh
case "$1 $*" in
  kustomize*) exec cat {DEPLOY / "manager" / "manager.yaml"};;
  apply*) echo "$@" >{tmp_path / "apply-args"}; cat >{applied};;
  *"-f -"*) cat >/dev/null;;
esac
""")
    stub.chmod(0o755)
    result = subprocess.run(["make", "--no-print-directory", "deploy", f"KUBECTL={stub}",
                             *variables], capture_output=True, text=True, timeout=60,
                            check=False, cwd=ROOT)
    return result, applied


@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
def test_make_deploy_without_the_urls_fails_with_a_clear_message(tmp_path: Path) -> None:
    for variables in ((), ("HIMITSU_API_URLS=",), ("HIMITSU_API_URLS=https://a|b",)):
        result, applied = _make_deploy(tmp_path, *variables)
        assert result.returncode != 0, variables
        assert "make deploy: " in result.stderr and "HIMITSU_API_URLS" in result.stderr
        assert not applied.exists(), "kubectl was run"


@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
def test_make_deploy_needs_one_url_and_runs_nothing_it_is_given(tmp_path: Path) -> None:
    """`,` would render `value: ,`, which the operator reads as no list at all (it would
    start unrestricted); a quote or a `$(...)` in the value must not become recipe text."""
    marker = tmp_path / "PWNED"
    for value in (",", ",,", f"https://h.example.com' ]; touch {marker}; [ '",
                  f'https://h.example.com"; touch {marker}; "',
                  f"https://h.example.com$(shell touch {marker})"):
        result, applied = _make_deploy(tmp_path, f"HIMITSU_API_URLS={value}")
        assert result.returncode != 0, value
        assert "make deploy: " in result.stderr and "HIMITSU_API_URLS" in result.stderr
        assert not applied.exists(), f"kubectl was run for {value!r}"
        assert not marker.exists(), f"{value!r} ran a command"


@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
def test_make_deploy_fills_in_the_urls(tmp_path: Path) -> None:
    urls = "https://himitsu.example.com,https://[::1]:8443/himitsu"
    result, applied = _make_deploy(tmp_path, f"HIMITSU_API_URLS={urls}")
    assert result.returncode == 0, result.stderr
    text = applied.read_text()
    assert PLACEHOLDER not in text
    (deploy,) = [d for d in yaml.safe_load_all(text) if d and d["kind"] == "Deployment"]
    (manager,) = deploy["spec"]["template"]["spec"]["containers"]
    assert {"name": "HIMITSU_API_URLS", "value": urls} in manager["env"]


def test_readme_install_lines_set_the_urls() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    install = readme.split("## Install", 1)[1].split("\n## ", 1)[0]
    assert f"s|{PLACEHOLDER}|https://himitsu.example.com|" in install
    assert "make deploy HIMITSU_API_URLS=https://himitsu.example.com" in install
    assert "kubectl apply -f deploy/manager/manager.yaml\n" not in install


# ---- kustomize -------------------------------------------------------------------------


def kustomization_files(directory: Path) -> list[Path]:
    """The manifest files a kustomization directory pulls in, recursively."""
    (kust,) = docs(str((directory / "kustomization.yaml").relative_to(ROOT)))
    files: list[Path] = []
    for entry in kust["resources"]:
        path = (directory / entry).resolve()
        assert path.exists(), f"{directory}: {entry} does not exist"
        files += kustomization_files(path) if path.is_dir() else [path]
    return files


def test_default_kustomization_is_the_contracts_three_files() -> None:
    files = kustomization_files(DEPLOY)
    assert files == [DEPLOY / "crd" / "himitsu.io_himitsusecrets.yaml",
                     DEPLOY / "rbac" / "role.yaml",
                     DEPLOY / "rbac" / "aggregate" / "himitsu_view.yaml",
                     DEPLOY / "rbac" / "aggregate" / "himitsu_edit.yaml",
                     DEPLOY / "manager" / "manager.yaml"]
    (kust,) = docs("deploy/kustomization.yaml")
    assert kust["namespace"] == NAMESPACE
    ids = [(d["kind"], d["metadata"]["name"])
           for f in files for d in docs(str(f.relative_to(ROOT)))]
    assert len(ids) == len(set(ids))


def test_every_kustomization_resolves() -> None:
    for kust in DEPLOY.rglob("kustomization.yaml"):
        if docs(str(kust.relative_to(ROOT)))[0]["kind"] == "Component":
            continue
        for path in kustomization_files(kust.parent):
            assert path.suffix == ".yaml"


# `make test` builds hack/kube/bin first, so CI always has a kubectl even with none on PATH.
KUBECTL = shutil.which("kubectl") or next(
    (str(p) for p in [ROOT / "hack" / "kube" / "bin" / "kubectl"] if p.exists()), None)


@pytest.mark.skipif(KUBECTL is None, reason="no kubectl on PATH and none built in hack/kube/bin")
def test_kubectl_kustomize_builds_the_default_install() -> None:
    assert KUBECTL is not None
    result = subprocess.run([KUBECTL, "kustomize", str(DEPLOY)], capture_output=True,
                            text=True, timeout=60, check=False)
    assert result.returncode == 0, result.stderr
    built = {(d["kind"], d["metadata"]["name"]) for d in yaml.safe_load_all(result.stdout)}
    expected = {(d["kind"], d["metadata"]["name"]) for f in kustomization_files(DEPLOY)
                for d in docs(str(f.relative_to(ROOT)))}
    assert built == expected
