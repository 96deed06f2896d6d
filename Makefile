# himitsu-controller: `make help` lists the targets.
SHELL := /usr/bin/env bash
.DEFAULT_GOAL := help

PYTHON_SYSTEM ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
LOCAL ?= .local
KUBECONFIG_LOCAL := $(abspath $(LOCAL))/kubeconfig
KUBECTL ?= $(shell command -v kubectl 2>/dev/null || echo $(LOCAL)/bin/kubectl)
IMG ?= ghcr.io/himitsu-io/himitsu-controller:0.1.0
KIND_CLUSTER ?= himitsu-e2e
PYTEST_ARGS ?=
# make deploy: where the operator may send tokens (--allowed-api-urls); required.
HIMITSU_API_URLS ?=
API_URLS_PLACEHOLDER := REPLACE-WITH-YOUR-HIMITSU-API-URLS
# make deploy/undeploy: WATCH_NAMESPACE=ns selects the namespaced install (deploy/namespaced);
# ROLLOUT_RESTARTS=yes adds the rollout-restart RBAC (deploy/components/rollout-restarts*).
WATCH_NAMESPACE ?=
WATCH_NAMESPACE_PLACEHOLDER := REPLACE-WITH-THE-WATCHED-NAMESPACE
ROLLOUT_RESTARTS ?=
HELM_VERSION ?= v3.22.0
HELM ?= $(abspath $(LOCAL))/bin/helm
CHART := charts/himitsu-controller

##@ Develop
.PHONY: help
help: ## Show this help
	@awk 'BEGIN {FS = ":.*##"} /^##@/ {printf "\n%s\n", substr($$0, 5)} /^[a-zA-Z0-9_-]+:.*##/ {printf "  %-16s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

$(VENV)/.installed: pyproject.toml
	$(PYTHON_SYSTEM) -m venv $(VENV)
	$(VENV)/bin/pip install -q --upgrade pip
	$(VENV)/bin/pip install -q -e '.[dev,docs]'
	touch $@

.PHONY: venv install-dev
venv: $(VENV)/.installed ## Create .venv with the operator and its dev tools
install-dev: venv

.PHONY: lint
lint: venv helm ## ruff, mypy --strict, the layer contract (import-linter), promtool on the alerts and dashboard, mkdocs --strict, the chart (in step with deploy/, helm lint --strict)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy --strict
	$(VENV)/bin/lint-imports
	$(PY) hack/monitoring.py
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict
	$(PYTHON_SYSTEM) hack/chart_sync.py --check
	@for values in $(CHART)/ci/*-values.yaml; do \
	  echo "$(HELM) lint --strict $(CHART) -f $$values"; \
	  $(HELM) lint --strict --quiet $(CHART) -f "$$values" || exit 1; done

.PHONY: docs
docs: venv ## Serve the documentation site (mkdocs) on http://127.0.0.1:8000
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs serve --dev-addr 127.0.0.1:8000

.PHONY: chart-sync
chart-sync: ## Copy deploy/'s CRD, RBAC rules, PrometheusRule and dashboard into the chart (deploy/ is the source)
	$(PYTHON_SYSTEM) hack/chart_sync.py

.PHONY: helm
helm: ## Build helm $(HELM_VERSION) from its Go module into .local/bin (cached; no downloaded binary)
	@HELM='$(HELM)' HELM_VERSION='$(HELM_VERSION)' bash hack/helm.sh >/dev/null

.PHONY: test
test: venv kube-build helm ## Unit tests, then the end-to-end suite on a local control plane (the CI command)
	$(PY) -m pytest tests/unit $(PYTEST_ARGS)
	$(PY) -m pytest tests/e2e -m "e2e and not faults" $(PYTEST_ARGS)

.PHONY: test-faults
test-faults: venv kube-build ## Fault-injection e2e tests (apiserver restarts, Himitsu outages, leader loss; CI runs them)
	$(PY) -m pytest tests/e2e -m "faults" $(PYTEST_ARGS)

.PHONY: test-unit
test-unit: venv helm ## Unit tests only (seconds, no cluster; helm renders the chart)
	$(PY) -m pytest tests/unit $(PYTEST_ARGS)

.PHONY: test-e2e
test-e2e: venv kube-build helm ## End-to-end suite (starts its own control plane, or uses E2E_KUBECONFIG)
	$(PY) -m pytest tests/e2e -m "e2e and not faults" $(PYTEST_ARGS)

##@ Local control plane (etcd, kube-apiserver, kube-controller-manager built from Go modules)
.PHONY: kube-build
kube-build: ## Build the control-plane binaries into hack/kube/bin (cached)
	bash hack/kube/build.sh

.PHONY: cluster-up
cluster-up: kube-build ## Start it on 127.0.0.1; kubeconfig in .local/kubeconfig, kubectl in .local/bin
	$(PYTHON_SYSTEM) hack/localcluster.py up --dir $(LOCAL)

.PHONY: cluster-status
cluster-status: ## Is the local control plane up?
	$(PYTHON_SYSTEM) hack/localcluster.py status --dir $(LOCAL)

.PHONY: cluster-down
cluster-down: ## Stop the local control plane (by PID)
	$(PYTHON_SYSTEM) hack/localcluster.py down --dir $(LOCAL)

##@ Run
.PHONY: demo
demo: venv cluster-up ## Local control plane + Himitsu stand-in + operator + the KeyValue sample, synced Secret shown
	$(PY) hack/demo.py up --dir $(LOCAL)

.PHONY: demo-down
demo-down: ## Stop what `make demo` started (operator, stand-in, control plane)
	-$(PY) hack/demo.py down --dir $(LOCAL)
	$(PYTHON_SYSTEM) hack/localcluster.py down --dir $(LOCAL)

.PHONY: run
run: venv ## Run the operator against the current kubeconfig (console logs)
	$(VENV)/bin/himitsu-controller --log-format console --metrics-bind-address 127.0.0.1:8080 --health-probe-bind-address 127.0.0.1:8081

##@ Deploy (to the cluster of the current kubeconfig; the chart in charts/ is the other way)
# What make deploy applies: deploy/ (or deploy/namespaced with WATCH_NAMESPACE), plus the
# rollout-restart RBAC with ROLLOUT_RESTARTS=yes, placeholders filled in from the environment.
RESTART_RBAC = deploy/components/rollout-restarts$(if $(WATCH_NAMESPACE),-namespaced)
define deploy_manifests
{ $(KUBECTL) kustomize deploy/$(if $(WATCH_NAMESPACE),namespaced) \
  $(if $(filter yes,$(ROLLOUT_RESTARTS)),&& printf -- '---\n' && cat $(RESTART_RBAC)/role.yaml \
  && printf -- '---\n' && cat $(RESTART_RBAC)/role_binding.yaml); } \
  | sed -e "s|$(API_URLS_PLACEHOLDER)|$$HIMITSU_API_URLS|" \
        -e "s|$(WATCH_NAMESPACE_PLACEHOLDER)|$$WATCH_NAMESPACE|"
endef

.PHONY: install
install: ## Apply (or upgrade) the CRD, server-side (--force-conflicts: over a CRD Helm created): what Helm never does for crds/
	$(KUBECTL) apply --server-side --force-conflicts -f deploy/crd/himitsu.io_himitsusecrets.yaml

.PHONY: uninstall-crd
uninstall-crd: ## DELETES the CRD, every HimitsuSecret, and (garbage collection) every Owner target Secret; CONFIRM=yes
	@if [ "$(CONFIRM)" != yes ]; then \
	  echo "make uninstall-crd deletes the HimitsuSecret CRD. With it the apiserver deletes every" >&2; \
	  echo "HimitsuSecret in every namespace, and garbage collection then deletes every Secret they" >&2; \
	  echo "own (creationPolicy Owner targets) that applications may be reading. Merge targets stay." >&2; \
	  echo "To go ahead: make uninstall-crd CONFIRM=yes" >&2; exit 2; fi
	$(KUBECTL) delete --ignore-not-found -f deploy/crd/himitsu.io_himitsusecrets.yaml

# The install paths never mix: make deploy and undeploy refuse when an object of theirs
# (the CRD aside: it is the same) carries Helm's release annotation.
HELM_OWNED := {{range .items}}{{$$o := .}}{{if ne .kind "CustomResourceDefinition"}}{{with .metadata.annotations}}{{with index . "meta.helm.sh/release-name"}}  {{$$o.kind}} {{$$o.metadata.name}}: Helm release {{.}}{{"\n"}}{{end}}{{end}}{{end}}{{end}}
# The other shape's grants (cluster-wide vs WATCH_NAMESPACE), removed by deploy and undeploy
# so switching shapes leaves no wider access behind; the namespaced one may be in any namespace.
CLUSTER_SHAPE := clusterrolebinding/himitsu-operator clusterrolebinding/himitsu-operator-rollout-restart \
  clusterrole/himitsu-operator clusterrole/himitsu-operator-rollout-restart
define refuse_helm_owned
owned=$$({ $(deploy_manifests); } | $(KUBECTL) get --ignore-not-found -f - -o go-template='$(HELM_OWNED)') \
  && owned="$$owned$$($(KUBECTL) get --ignore-not-found $(CLUSTER_SHAPE) -o go-template='$(HELM_OWNED)')" \
  && if [ -n "$$owned" ]; then \
    printf 'make %s: a Helm release owns objects of these names; use helm for this cluster (never both paths):\n%s' \
      "$@" "$$owned" >&2; exit 2; fi
endef
define delete_other_shape
$(if $(WATCH_NAMESPACE),$(KUBECTL) delete --ignore-not-found $(CLUSTER_SHAPE),\
  $(KUBECTL) delete --ignore-not-found role,rolebinding --all-namespaces \
    -l 'app.kubernetes.io/name=himitsu-operator,app.kubernetes.io/managed-by!=Helm' \
    --field-selector metadata.name!=himitsu-operator-leader-election)
endef

.PHONY: deploy
# $(value): the text as given, so a $(...) in it is refused below, never expanded by make.
deploy: override export HIMITSU_API_URLS := $(value HIMITSU_API_URLS)
deploy: override export WATCH_NAMESPACE := $(value WATCH_NAMESPACE)
deploy: ## Apply CRD, RBAC and the operator (kustomize: deploy/); HIMITSU_API_URLS=https://... required; WATCH_NAMESPACE, ROLLOUT_RESTARTS=yes
	@# The value reaches the shell through the environment only, never as recipe text.
	@case "$$HIMITSU_API_URLS" in *[!,]*) ;; *) \
	  echo "make deploy: set HIMITSU_API_URLS to your Himitsu API URL(s), comma-separated: the operator sends tokens there and nowhere else, e.g." >&2; \
	  echo "  make deploy HIMITSU_API_URLS=https://himitsu.example.com" >&2; exit 2;; esac
	@case "$$HIMITSU_API_URLS" in *[!A-Za-z0-9.:/,_~[\]-]*) \
	  echo "make deploy: HIMITSU_API_URLS may hold only URLs (letters, digits and .:/,_~[]-)" >&2; exit 2;; esac
	@case "$$WATCH_NAMESPACE" in *[!a-z0-9-]*|-*) \
	  echo "make deploy: WATCH_NAMESPACE must be a namespace name (a-z, 0-9, -)" >&2; exit 2;; esac
	@case "$(ROLLOUT_RESTARTS)" in ""|yes|no) ;; *) \
	  echo "make deploy: ROLLOUT_RESTARTS is yes or no" >&2; exit 2;; esac
	@set -o pipefail; $(refuse_helm_owned)
	set -o pipefail; $(deploy_manifests) | $(KUBECTL) apply -f -
	$(delete_other_shape)

.PHONY: undeploy
undeploy: override export WATCH_NAMESPACE := $(value WATCH_NAMESPACE)
undeploy: override ROLLOUT_RESTARTS := yes
undeploy: ## Remove the operator (Deployment, Service, RBAC of both shapes); keeps the CRD, every HimitsuSecret and Secret
	@case "$$WATCH_NAMESPACE" in *[!a-z0-9-]*|-*) \
	  echo "make undeploy: WATCH_NAMESPACE must be a namespace name (a-z, 0-9, -)" >&2; exit 2;; esac
	@# Only what carries app.kubernetes.io/name=himitsu-operator: never the CRD (deleting it
	@# deletes every HimitsuSecret) nor the himitsu-system Namespace (it may hold your own).
	@set -o pipefail; $(refuse_helm_owned)
	set -o pipefail; $(deploy_manifests) \
	  | $(KUBECTL) delete --ignore-not-found -l app.kubernetes.io/name=himitsu-operator -f -
	$(delete_other_shape)

.PHONY: docker-build
# PYTHON_IMAGE: the Python 3.11 base (the Dockerfile's, pinned by digest); OFFLINE=1: build one locally with
# mmdebstrap (no registry needed); BUILDER=buildx|docker|buildah skips the detection.
docker-build: ## Build $(IMG) with docker BuildKit or buildah, whichever works; OFFLINE=1: no registry
	PYTHON_IMAGE='$(PYTHON_IMAGE)' OFFLINE='$(OFFLINE)' BUILDER='$(BUILDER)' \
	  bash hack/image/build.sh '$(IMG)'

.PHONY: lock
lock: venv ## Renew requirements.lock (the image's packages) and hack/image/build-tools.lock, with hashes (uv)
	bash hack/image/lock.sh

.PHONY: docker-smoke
docker-smoke: venv docker-build ## Run $(IMG) as deploy/manager does (read-only, 65532, no caps, in-cluster config): sync, SIGTERM; its packages and SBOM against the lock
	E2E_IMAGE='$(IMG)' $(PY) -m pytest tests/e2e/test_image.py tests/e2e/test_image_contents.py \
	  -m image -rs $(PYTEST_ARGS)

##@ kind (needs Docker and Go; KIND_OFFLINE=1 builds every image locally, no registry)
KIND_OFFLINE ?=
export KIND_OFFLINE
.PHONY: kube-node-build
kube-node-build: ## Also build kubelet, kubeadm, kube-proxy, kube-scheduler into hack/kube/bin (for the offline kind node)
	bash hack/kube/build.sh node

.PHONY: kind-node-image
kind-node-image: ## Build the offline kind node image (cached by content; prints its name)
	bash hack/kind/offline/node.sh

.PHONY: kind-up
kind-up: ## Create kind cluster $(KIND_CLUSTER); kubeconfig in .local/kind/$(KIND_CLUSTER)/kubeconfig
	bash hack/kind/kind.sh up $(KIND_CLUSTER)

.PHONY: kind-down
kind-down: ## Delete it, its docker network, and restore the host's sysctls
	bash hack/kind/kind.sh down $(KIND_CLUSTER)

.PHONY: e2e-kind
e2e-kind: venv ## Cluster up, image built and loaded, the chart installed (helm), the e2e suite in-cluster, cluster down
	bash hack/kind/kind.sh e2e $(KIND_CLUSTER) $(IMG)

##@ Benchmarks
.PHONY: bench
# The operator under bench runs from a venv of requirements.lock alone, as in the image.
RUN_VENV ?= .venv-run
$(RUN_VENV)/.installed: requirements.lock
	rm -rf $(RUN_VENV)
	$(PYTHON_SYSTEM) -m venv $(RUN_VENV)
	$(RUN_VENV)/bin/pip install -q --require-hashes --only-binary :all: -r requirements.lock
	touch $@

bench: venv kube-build $(RUN_VENV)/.installed ## Steady-state cost, poll sharing, cold sync, drift repair, memory at 1,000/5,000 (~30 min; a table, bench/results/)
	$(PY) bench/run.py --operator-python $(RUN_VENV)/bin/python

.PHONY: bench-memory
bench-memory: venv kube-build $(RUN_VENV)/.installed ## Memory alone: RSS after a cold sync of 1,000/5,000/10,000 (~10 min); BENCH_BASELINE_SRC=<tree>/src adds a baseline
	$(PY) bench/run.py --operator-python $(RUN_VENV)/bin/python --scenarios memory --memory-sizes 1000,5000,10000

##@ Soak
.PHONY: soak
soak: venv kube-build ## Chaos soak (issue 26): seeded faults, invariants checked, figures; SOAK_MINUTES=30 SOAK_SEED= SOAK_OBJECTS=300
	PYTHONPATH=tests $(PY) -m soak

.PHONY: clean
clean: ## Remove build and test leftovers (not the Go caches)
	rm -rf build dist *.egg-info .pytest_cache .mypy_cache .ruff_cache hack/kube/bin hack/prometheus/bin
