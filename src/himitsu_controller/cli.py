"""``himitsu-controller``: flags in, a running Manager out.

The only module that knows every layer: it builds the runtime, the Himitsu client and
the shared poller, and plugs the reconciler into them through the adapter (``kube``).
Bad flags and an unreachable cluster end in one line and a non-zero exit, never a
traceback: that line is what an operator sees in ``kubectl logs``.
"""

from __future__ import annotations

import argparse
import os
import socket
import ssl
import sys
import threading
import time
from collections.abc import Callable, Sequence
from typing import TypeVar

import structlog

from himitsu_controller import __version__, api, himitsu, kube, metrics, watches
from himitsu_controller import logging as hlogging
from himitsu_controller.runtime.cache.informer import Informer
from himitsu_controller.runtime.cache.pager import LIST_PAGES, lists_from_snapshots
from himitsu_controller.runtime.client.config import ClientConfig, ConfigError, load_client_config
from himitsu_controller.runtime.client.rest import ApiError, RestClient, TransportError
from himitsu_controller.runtime.client.transport import new_api_client
from himitsu_controller.runtime.controller import Controller
from himitsu_controller.runtime.events import EventRecorder
from himitsu_controller.runtime.leader.election import (
    LeaderElectionConfig,
    LeaderElector,
    default_identity,
)
from himitsu_controller.runtime.leader.writegate import WriteGate
from himitsu_controller.runtime.manager import Manager
from himitsu_controller.runtime.metricsauth import ScrapeAuthorizer, SecureServing, ServingCert
from himitsu_controller.runtime.parts import LeaderElectionFactory
from himitsu_controller.runtime.resync import Resync
from himitsu_controller.sync import allowlist, summary
from himitsu_controller.sync.polling import pacing, polls
from himitsu_controller.sync.reconciler import HimitsuSecretReconciler

log = structlog.get_logger(__name__)

CONTROLLER_NAME = "himitsusecret"
LEASE_NAME = "himitsu-operator.himitsu.io"
IN_CLUSTER_NAMESPACE_FILE = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"
EVENT_QPS, EVENT_BURST = 20.0, 50
# deploy/manager/manager.yaml's HIMITSU_API_URLS: left as is, the operator refuses to start.
API_URLS_PLACEHOLDER = "REPLACE-WITH-YOUR-HIMITSU-API-URLS"
MIN_SYNC_PERIOD = 60.0  # a resync queues every HimitsuSecret: a safety net, not the schedule
# An unreachable apiserver is waited for this long at startup, under the liveness probe's
# first restart (15 s + 3 x 20 s): no CrashLoopBackOff for a short outage.
STARTUP_API_WAIT = 60.0
STARTUP_API_BACKOFF = (1.0, 10.0)  # first delay, cap
WATCH_LIVENESS_MIN = 10.0
_N = TypeVar("_N", int, float)


def _duration(least: float = 0.0, *, off: bool = True,
              too_short: str = "") -> Callable[[str], float]:
    """A Go duration flag (``15s``, ``1m30s``, ``-0`` is 0 as in Go) of ``least`` or more,
    or (``off``) 0; ``too_short``: the refusal's words, after the value."""
    allowed = "more than 0" if least == 0 else f"at least {api.format_duration(least)}"
    too_short = too_short or f"is too short: it takes {f'0 (off) or {allowed}' if off else allowed}"

    def parse(text: str) -> float:
        bare = text.strip()
        if bare.lstrip("+-").replace(".", "", 1).isdigit() and float(bare) != 0:  # Go: "0" only
            raise argparse.ArgumentTypeError(
                f"{bare!r} has no unit: write a Go duration such as {bare.lstrip('+-')}s or 1m30s")
        try:
            value = api.parse_duration(bare.removeprefix("-"), what="duration")
        except api.InvalidSpec as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
        if bare.startswith("-") and value != 0:
            raise argparse.ArgumentTypeError(f"{bare!r} is negative: it takes 0 or more, e.g. 30s")
        if (value == 0 and not off) or 0 < value < least:
            raise argparse.ArgumentTypeError(f"{bare!r} {too_short}")
        return value

    return parse


def _positive(kind: type[_N]) -> Callable[[str], _N]:
    """A flag of ``kind`` (int or float) greater than 0."""
    noun = "a whole number" if kind is int else "a number"
    floor = "at least 1" if kind is int else "greater than 0"

    def parse(text: str) -> _N:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not {noun}") from None
        if value <= 0:
            raise argparse.ArgumentTypeError(f"must be {floor}")
        return value

    return parse


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="himitsu-controller",
        description="Sync Himitsu environments into Kubernetes Secrets (HimitsuSecret resources).",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    p.add_argument("--kubeconfig", default=None,
                   help="kubeconfig file (default: $KUBECONFIG, in-cluster, ~/.kube/config)")
    p.add_argument("--namespace", default=None,
                   help="watch only this namespace (a namespaced Role then suffices); "
                        "default: all namespaces")
    p.add_argument("--workers", type=_positive(int), default=8, help="concurrent reconciles")
    p.add_argument("--sync-period", type=_duration(MIN_SYNC_PERIOD, too_short=(
                       "is shorter than 1m: the resync queues every HimitsuSecret, a safety net "
                       "and not the poll schedule (refreshInterval is); use 1m or more, or 0 to "
                       "turn it off")), default="10h", metavar="DURATION",
                   help="every HimitsuSecret is reconciled again at least this often, as a "
                        "safety net (controller-runtime's SyncPeriod); an object whose poll "
                        "is not due costs nothing; at least 1m, 0 disables")
    le = p.add_argument_group("leader election")
    le.add_argument("--leader-elect", action="store_true",
                    help="elect a leader through a Lease; required with more than one replica")
    le.add_argument("--leader-election-namespace", default=None,
                    help="namespace of the Lease (default: the pod's namespace, "
                         "'default' outside a cluster)")
    le.add_argument("--leader-election-id", default=LEASE_NAME, help="name of the Lease")
    # Duration defaults are strings: argparse parses them like the command line, and the
    # help then shows them as a user writes them (15s, not 15.0).
    le.add_argument("--leader-election-lease-duration", type=_duration(off=False), default="15s",
                    metavar="DURATION", help="how long a standby waits before taking over")
    le.add_argument("--leader-election-renew-deadline", type=_duration(off=False), default="10s",
                    metavar="DURATION", help="how long the leader retries renewing")
    le.add_argument("--leader-election-retry-period", type=_duration(off=False), default="2s",
                    metavar="DURATION", help="interval between acquire/renew attempts")
    ops = p.add_argument_group("serving and limits")
    ops.add_argument("--metrics-bind-address", default=":8080",
                     help="address for /metrics; '0' disables")
    ops.add_argument("--metrics-secure", action="store_true",
                     help="serve /metrics over HTTPS, each scrape authenticated (TokenReview) "
                          "and authorized (SubjectAccessReview: get on /metrics) by the "
                          "apiserver; needs --metrics-cert-dir")
    ops.add_argument("--metrics-cert-dir", default=None, metavar="DIR",
                     help="tls.crt and tls.key for --metrics-secure (a kubernetes.io/tls "
                          "Secret, e.g. from cert-manager); read again when they change")
    ops.add_argument("--health-probe-bind-address", default=":8081",
                     help="address for /healthz and /readyz; '0' disables")
    ops.add_argument("--graceful-shutdown-timeout", type=_duration(), default="30s",
                     metavar="DURATION", help="bound on the whole shutdown: draining in-flight "
                     "reconciles, flushing Events, releasing the Lease, stopping watches")
    ops.add_argument("--watch-liveness-timeout", default="5m", metavar="DURATION",
                     type=_duration(WATCH_LIVENESS_MIN),
                     help="/healthz fails (the kubelet restarts the pod) once the apiserver "
                          "has answered this long without a working watch for a cache (an "
                          "unreachable apiserver does not count); at least 10s, 0 disables")
    ops.add_argument("--kube-api-qps", type=_positive(float), default=150.0,
                     help="client-side request rate limit towards kube-apiserver")
    ops.add_argument("--kube-api-burst", type=_positive(int), default=300,
                     help="client-side burst towards kube-apiserver")
    ops.add_argument("--list-pages", choices=LIST_PAGES, default="auto",
                     help="list in pages from the watch cache: auto = on kube-apiserver"
                          " 1.34+ (a restart never decodes a whole list at once); off ="
                          " never (for ListFromCacheSnapshot turned off, or a load balancer"
                          " that spreads one client's requests over several apiservers:"
                          " there pages after the first are read from etcd)")
    hm = p.add_argument_group("Himitsu API")
    hm.add_argument("--allowed-api-urls", default=None,
                    help="comma-separated Himitsu URL prefixes a HimitsuSecret's apiUrl must "
                         "be under (set it in production: without the flag any HimitsuSecret "
                         "may send its token anywhere, and a warning and a metric say so; "
                         "given but empty, the operator refuses to start)")
    hm.add_argument("--allow-insecure-http", action="store_true",
                    help="accept plain http:// apiUrls (tokens in clear text: a loopback or "
                         "in-cluster test server only)")
    hm.add_argument("--himitsu-ca-file", default=None,
                    help="CA bundle for a self-hosted Himitsu (REQUESTS_CA_BUNDLE is honoured too)")
    lg = p.add_argument_group("logging")
    lg.add_argument("--log-level", choices=hlogging.LEVELS, default="info")
    lg.add_argument("--log-format", choices=hlogging.FORMATS, default="json")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    hlogging.configure(level=args.log_level, fmt=args.log_format)
    if args.himitsu_ca_file and not os.path.isfile(args.himitsu_ca_file):
        return _fatal(f"--himitsu-ca-file {args.himitsu_ca_file}: no such file")
    try:
        return run(args)
    except ConfigError as exc:
        return _fatal(str(exc))
    except (ApiError, TransportError) as exc:
        return _fatal(f"cannot reach the Kubernetes API: {exc}")


def run(args: argparse.Namespace, *, stop: threading.Event | None = None) -> int:
    allowed = _allowed_api_urls(args)
    # With leader election, reconcile writes and Events go out only while the gate says
    # this replica holds the Lease (runtime/leader/writegate.py).
    gate = WriteGate() if args.leader_elect else None
    config = load_client_config(args.kubeconfig)  # one set of credentials for every client
    secure = _metrics_secure(args, config)  # bad flags or certificate: before any waiting
    # Each watch holds a pooled connection for its life: two informers, workers, slack.
    rest = RestClient(new_api_client(config, pool_maxsize=args.workers + 8),
                      qps=args.kube_api_qps, burst=args.kube_api_burst,
                      user_agent=_user_agent(""), write_gate=gate)
    election = _leader_election(elector_client(config), args, gate) if gate else None
    _check_reachable(rest, args.namespace, stop=stop)
    snapshots = lists_from_snapshots(rest, pages=args.list_pages)  # runtime/cache/pager.py
    hsecs = Informer(
        rest, kube.HIMITSU_SECRETS, namespace=args.namespace, name="himitsusecrets",
        indexers={watches.TARGET_INDEX: watches.target_index,
                  watches.AUTH_INDEX: kube.token_refs},
        transform=summary.himitsu_secret, shared=summary.SHARED, list_snapshots=snapshots,
    )
    secrets = Informer(  # summaries, never values: a write reads its target afresh
        rest, kube.SECRETS, namespace=args.namespace, name="secrets",
        label_selector=f"{api.LABEL_MANAGED}=true", transform=summary.secret,
        shared=summary.SHARED, list_snapshots=snapshots,
        indexers={kube.OWNER_INDEX: kube.owner_uids},
    )
    pacer = pacing.Pacer()  # one line per API key and URL
    metrics.report_headroom(pacer.headroom)
    client = himitsu.HimitsuClient(ca_file=args.himitsu_ca_file, observer=metrics.count_request,
                                   pacing=pacer)
    # Events have their own client and limiter, as in client-go: best-effort, they must
    # neither delay a reconcile nor spend its writes' budget (a cold sync writes 1 Event each).
    recorder = EventRecorder(
        RestClient(new_api_client(config, pool_maxsize=2), qps=EVENT_QPS, burst=EVENT_BURST,
                   write_gate=gate, user_agent=_user_agent("events")),
        component=kube.COMPONENT, reporting_controller=kube.REPORTING_CONTROLLER,
        instance=socket.gethostname(),
    )
    kube_client = kube.KubeClient(rest, himitsu_secrets=hsecs.store, secrets=secrets.store,
                                  events=recorder)
    watches.forget_tokens_with_their_users(hsecs, kube_client)
    reconciler = HimitsuSecretReconciler(
        kube_client, polls.SharedPoller(client, pacer=pacer), allowed_api_urls=allowed,
        allow_insecure_http=args.allow_insecure_http,
    )
    ctrl = Controller(CONTROLLER_NAME, reconciler.reconcile, workers=args.workers)
    watches.wire_events(ctrl, hsecs, secrets)
    manager = Manager(
        metrics_bind_address=args.metrics_bind_address,
        health_probe_bind_address=args.health_probe_bind_address,
        leader_election=election, graceful_shutdown_timeout=args.graceful_shutdown_timeout,
        events=recorder,  # started by the manager, flushed once the workers stopped
        watch_liveness_timeout=args.watch_liveness_timeout, metrics_secure=secure,
    )
    manager.add_informer(hsecs)
    manager.add_informer(secrets)
    manager.add_controller(ctrl)
    if args.sync_period > 0:
        manager.add_runnable(
            "resync", Resync(hsecs.store.keys, ctrl.enqueue_after, period=args.sync_period).run)
    log.info("starting", version=__version__, namespace=args.namespace or "*",
             leader_elect=args.leader_elect, workers=args.workers)
    try:
        return manager.run(stop)
    finally:
        client.close()


def _user_agent(role: str) -> str:
    return f"himitsu-controller/{__version__} {role}".rstrip()


def _allowed_api_urls(args: argparse.Namespace) -> list[str]:
    """The checked --allowed-api-urls entries, else ConfigError. Unrestricted only when the
    flag is absent: an empty value is an install gone wrong (``HIMITSU_API_URLS=,``)."""
    given: str | None = args.allowed_api_urls
    entries = [e.strip() for e in (given or "").split(",") if e.strip()]
    if given is not None and not entries:
        raise ConfigError(
            f"--allowed-api-urls {given[:100]!r} holds no URL: set it to your Himitsu API "
            "URL(s), comma-separated, or leave the flag out to accept any URL (not for "
            "production)")
    if API_URLS_PLACEHOLDER in entries:
        raise ConfigError(
            f"--allowed-api-urls is still the install placeholder {API_URLS_PLACEHOLDER}: set "
            "HIMITSU_API_URLS in deploy/manager/manager.yaml to your Himitsu API URL(s), or "
            "deploy with `make deploy HIMITSU_API_URLS=https://himitsu.example.com`")
    try:
        unrestricted = allowlist.AllowList(
            entries, allow_insecure_http=args.allow_insecure_http).unrestricted
    except allowlist.InvalidPrefix as exc:
        raise ConfigError(str(exc)) from None
    metrics.api_urls_unrestricted.set(1 if unrestricted else 0)
    if unrestricted:
        log.warning("no --allowed-api-urls: any HimitsuSecret may have its token sent to any "
                    "URL; set it to your Himitsu API URL(s)")
    if args.allow_insecure_http:
        log.warning("--allow-insecure-http: tokens may be sent over plain http")
    return entries


def _metrics_secure(args: argparse.Namespace, config: ClientConfig) -> SecureServing | None:
    """--metrics-secure: the serving certificate, and a client of its own for the reviews
    (no write gate: a standby answers scrapes too; no retries: a scrape waits for none)."""
    if not args.metrics_secure:
        if args.metrics_cert_dir:
            raise ConfigError("--metrics-cert-dir is only read with --metrics-secure")
        return None
    if not args.metrics_cert_dir:
        raise ConfigError("--metrics-secure needs --metrics-cert-dir: a directory holding "
                          "tls.crt and tls.key (mount a kubernetes.io/tls Secret there)")
    try:
        cert = ServingCert(args.metrics_cert_dir)
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(f"--metrics-cert-dir {args.metrics_cert_dir}: cannot load tls.crt "
                          f"and tls.key ({exc.strerror or type(exc).__name__})") from None
    reviews = RestClient(new_api_client(config, pool_maxsize=4, retries=0), max_retries=0,
                         user_agent=_user_agent("metrics-auth"))
    return SecureServing(tls=cert.current, authorize=ScrapeAuthorizer(reviews).authorize)


def elector_client(config: ClientConfig) -> RestClient:
    """The elector's own client: never behind reconcile traffic in the limiter, no retry
    behind its back, and a deadline on each whole request, so a renewal keeps to the renew
    deadline."""
    return RestClient(new_api_client(config, pool_maxsize=2, retries=0), max_retries=0,
                      request_deadlines=True, user_agent=_user_agent("leader-election"))


def _leader_election(rest: RestClient, args: argparse.Namespace,
                     gate: WriteGate) -> LeaderElectionFactory:
    namespace = args.leader_election_namespace or _pod_namespace() or "default"
    try:  # the config's own checks (client-go's), as one line
        config = LeaderElectionConfig(
            namespace=namespace, name=args.leader_election_id, identity=default_identity(),
            lease_duration=args.leader_election_lease_duration,
            renew_deadline=args.leader_election_renew_deadline,
            retry_period=args.leader_election_retry_period,
        )
    except ValueError as exc:  # e.g. a lease duration that is not whole seconds
        raise ConfigError(f"--leader-election-*: {exc}") from None
    return lambda started, stopped: LeaderElector(
        rest, config, on_started_leading=started, on_stopped_leading=stopped, gate=gate)


def _pod_namespace() -> str | None:
    if os.environ.get("POD_NAMESPACE"):
        return os.environ["POD_NAMESPACE"]
    try:
        with open(IN_CLUSTER_NAMESPACE_FILE, encoding="utf-8") as fh:
            return fh.read().strip() or None
    except OSError:
        return None


def _check_reachable(rest: RestClient, namespace: str | None, *,
                     stop: threading.Event | None = None,
                     clock: Callable[[], float] = time.monotonic) -> None:
    """ConfigError or ApiError at once without our CRD or when refused (401, 403); while the
    apiserver is unreachable or answers 5xx/429, wait with a backoff up to STARTUP_API_WAIT."""
    path = kube.HIMITSU_SECRETS.path(namespace)
    pause = stop or threading.Event()
    deadline = clock() + STARTUP_API_WAIT
    delay, cap = STARTUP_API_BACKOFF
    attempt = 0
    while True:
        attempt += 1
        try:
            rest.request("GET", path, query={"limit": 1}, timeout=15.0)
            if attempt > 1:
                log.info("Kubernetes API reachable", attempts=attempt)
            return
        except ApiError as exc:
            if exc.status == 404:
                raise ConfigError(
                    "the HimitsuSecret CRD is not installed: "
                    "kubectl apply -f deploy/crd/himitsu.io_himitsusecrets.yaml") from None
            if exc.status < 500 and exc.status != 429:
                raise
            failure: ApiError | TransportError = exc
        except TransportError as exc:
            failure = exc
        left = deadline - clock()
        if left <= 0:
            log.error("giving up: Kubernetes API unreachable", attempts=attempt,
                      waited_seconds=STARTUP_API_WAIT, error=str(failure))
            raise failure
        wait = min(delay, left)
        log.warning("Kubernetes API unreachable, waiting for it", error=str(failure),
                    attempt=attempt, retry_in=round(wait, 1), gives_up_in=round(left, 1))
        if pause.wait(wait):
            return  # stopped meanwhile: the manager, given the same stop, returns at once
        delay = min(cap, delay * 2)


def _fatal(message: str) -> int:
    print(f"himitsu-controller: error: {message}", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
