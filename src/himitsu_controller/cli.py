"""``himitsu-controller``: flags in, a running Manager out.

This is the only module that knows every layer: it builds the generic runtime
(informers, controller, leader election, manager), the Himitsu client and the shared
poller, and plugs the reconciler (``sync/``) into it through the adapter (``kube``).
Bad flags and an unreachable cluster end in one clear line and a non-zero exit, never a
traceback, because that line is what an operator sees in ``kubectl logs``.
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
from typing import Any

import structlog

from himitsu_controller import __version__, api, himitsu, kube, metrics
from himitsu_controller import logging as hlogging
from himitsu_controller.runtime import handler
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
from himitsu_controller.runtime.resync import Resync
from himitsu_controller.sync import allowlist, summary
from himitsu_controller.sync.polling import pacing, polls
from himitsu_controller.sync.reconciler import HimitsuSecretReconciler

log = structlog.get_logger(__name__)

CONTROLLER_NAME = "himitsusecret"
LEASE_NAME = "himitsu-operator.himitsu.io"
TARGET_INDEX = "target"
AUTH_INDEX = "auth-secret-ref"
IN_CLUSTER_NAMESPACE_FILE = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"
EVENT_QPS, EVENT_BURST = 20.0, 50
# What deploy/manager/manager.yaml ships in HIMITSU_API_URLS: left as is, the operator
# refuses to start (`make deploy HIMITSU_API_URLS=...` replaces it).
API_URLS_PLACEHOLDER = "REPLACE-WITH-YOUR-HIMITSU-API-URLS"
# A resync queues every HimitsuSecret at once: a safety net, never the poll schedule
# (refreshInterval is), so more often than this is refused rather than obeyed.
MIN_SYNC_PERIOD = 60.0
# At startup an unreachable apiserver is waited for (with backoff, logged) this long, under
# the liveness probe's first restart (15 s + 3 x 20 s): no CrashLoopBackOff for a short
# outage. A pod already running never restarts for one (see runtime/manager.py).
STARTUP_API_WAIT = 60.0
STARTUP_API_BACKOFF = (1.0, 10.0)  # first delay, cap
WATCH_LIVENESS_MIN = 10.0


def _duration(text: str) -> float:
    """A Go duration (``15s``, ``1m30s``, ``500ms``), as every duration flag takes and shows;
    0 or more (``-0`` is 0, as in Go)."""
    bare = text.strip()
    if bare.lstrip("+-").replace(".", "", 1).isdigit() and float(bare) != 0:  # Go: "0" alone
        raise argparse.ArgumentTypeError(
            f"{bare!r} has no unit: write a Go duration such as {bare.lstrip('+-')}s or 1m30s")
    negative = bare.startswith("-")
    try:
        value = api.parse_duration(bare[1:] if negative else bare)
    except api.InvalidSpec as exc:
        raise argparse.ArgumentTypeError(str(exc).replace("refreshInterval", "duration")) from None
    if negative and value != 0:
        raise argparse.ArgumentTypeError(f"{bare!r} is negative: it takes 0 or more, e.g. 30s")
    return value


def _duration_at_least(least: float, *, off: bool) -> Callable[[str], float]:
    """A duration flag of ``least`` or more (``off``: or 0, which turns it off)."""
    allowed = "more than 0" if least == 0 else f"at least {api.format_duration(least)}"
    allowed = f"0 (off) or {allowed}" if off else allowed

    def parse(text: str) -> float:
        value = _duration(text)
        if value == 0 and off:
            return value
        if value <= 0 or value < least:
            raise argparse.ArgumentTypeError(f"{text.strip()!r} is too short: it takes {allowed}")
        return value

    return parse


_positive_duration = _duration_at_least(0, off=False)


def _sync_period(text: str) -> float:
    value = _duration(text)
    if 0 < value < MIN_SYNC_PERIOD:
        raise argparse.ArgumentTypeError(
            f"{text.strip()!r} is shorter than 1m: the resync queues every HimitsuSecret, a "
            "safety net and not the poll schedule (refreshInterval is); use 1m or more, "
            "or 0 to turn it off")
    return value


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError("must be at least 1")
    return value


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if value <= 0:
        raise argparse.ArgumentTypeError("must be greater than 0")
    return value


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
    p.add_argument("--workers", type=_positive_int, default=8, help="concurrent reconciles")
    p.add_argument("--sync-period", type=_sync_period, default="10h", metavar="DURATION",
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
    le.add_argument("--leader-election-lease-duration", type=_positive_duration, default="15s",
                    metavar="DURATION", help="how long a standby waits before taking over")
    le.add_argument("--leader-election-renew-deadline", type=_positive_duration, default="10s",
                    metavar="DURATION", help="how long the leader retries renewing")
    le.add_argument("--leader-election-retry-period", type=_positive_duration, default="2s",
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
    ops.add_argument("--graceful-shutdown-timeout", type=_duration, default="30s",
                     metavar="DURATION", help="bound on the whole shutdown: draining in-flight "
                     "reconciles, flushing Events, releasing the Lease, stopping watches")
    ops.add_argument("--watch-liveness-timeout", default="5m", metavar="DURATION",
                     type=_duration_at_least(WATCH_LIVENESS_MIN, off=True),
                     help="/healthz fails (the kubelet restarts the pod) once the apiserver "
                          "has answered this long without a working watch for a cache (an "
                          "unreachable apiserver does not count); at least 10s, 0 disables")
    ops.add_argument("--kube-api-qps", type=_positive_float, default=150.0,
                     help="client-side request rate limit towards kube-apiserver")
    ops.add_argument("--kube-api-burst", type=_positive_int, default=300,
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
    workers = args.workers
    # With leader election, writes (reconciles' and Events') go out only while the gate
    # says this replica holds the Lease (runtime/leader/writegate.py).
    gate = WriteGate() if args.leader_elect else None
    # One configuration, and so one set of credentials (one credential plugin run), for
    # the three clients.
    config = load_client_config(args.kubeconfig)
    secure = _metrics_secure(args, config)  # bad flags or certificate: before any waiting
    # Each watch holds a pooled connection for its life: two informers, workers, slack.
    rest = RestClient(
        new_api_client(config, pool_maxsize=workers + 8),
        qps=args.kube_api_qps, burst=args.kube_api_burst,
        user_agent=f"himitsu-controller/{__version__}", write_gate=gate,
    )
    election = (_leader_election(elector_client(config), args, gate)
                if gate is not None else None)  # bad flags stop us before any waiting
    _check_reachable(rest, args.namespace, stop=stop)
    # Lists in pages where the watch cache serves them so: a restart's first lists are
    # never decoded whole (runtime/cache/pager.py).
    snapshots = lists_from_snapshots(rest, pages=args.list_pages)
    hsecs = Informer(
        rest, kube.HIMITSU_SECRETS, namespace=args.namespace, name="himitsusecrets",
        indexers={TARGET_INDEX: _target_index, AUTH_INDEX: kube.token_refs},
        transform=summary.himitsu_secret, shared=summary.SHARED, list_snapshots=snapshots,
    )
    # Summaries, never values: a write reads its target afresh (sync/summary.py).
    secrets = Informer(
        rest, kube.SECRETS, namespace=args.namespace, name="secrets",
        label_selector=f"{api.LABEL_MANAGED}=true", transform=summary.secret,
        shared=summary.SHARED, list_snapshots=snapshots,
        indexers={kube.OWNER_INDEX: kube.owner_uids},
    )
    # One line per API key and URL: the poller's first attempts and the client's retries.
    pacer = pacing.Pacer()
    metrics.report_headroom(pacer.headroom)
    client = himitsu.HimitsuClient(ca_file=args.himitsu_ca_file, observer=metrics.count_request,
                                   pacing=pacer)
    # Events have their own client and limiter, as in client-go: they are best-effort and
    # must neither delay a reconcile nor spend the budget its writes need (a cold sync of
    # 1,000 HimitsuSecrets writes 1,000 Events).
    recorder = EventRecorder(
        RestClient(new_api_client(config, pool_maxsize=2),
                   qps=EVENT_QPS, burst=EVENT_BURST, write_gate=gate,
                   user_agent=f"himitsu-controller/{__version__} events"),
        component=kube.COMPONENT, reporting_controller=kube.REPORTING_CONTROLLER,
        instance=socket.gethostname(),
    )
    kube_client = kube.KubeClient(rest, himitsu_secrets=hsecs.store, secrets=secrets.store,
                                  events=recorder)
    _forget_tokens_with_their_users(hsecs, kube_client)
    reconciler = HimitsuSecretReconciler(
        kube_client, polls.SharedPoller(client, pacer=pacer), allowed_api_urls=allowed,
        allow_insecure_http=args.allow_insecure_http,
    )
    ctrl = Controller(CONTROLLER_NAME, reconciler.reconcile, workers=workers)
    _wire_events(ctrl, hsecs, secrets)
    manager = Manager(
        metrics_bind_address=args.metrics_bind_address,
        health_probe_bind_address=args.health_probe_bind_address,
        leader_election=election,
        graceful_shutdown_timeout=args.graceful_shutdown_timeout,
        events=recorder,
        watch_liveness_timeout=args.watch_liveness_timeout,
        metrics_secure=secure,
    )
    manager.add_informer(hsecs)
    manager.add_informer(secrets)
    manager.add_controller(ctrl)
    if args.sync_period > 0:
        manager.add_runnable(
            "resync", Resync(hsecs.store.keys, ctrl.enqueue_after, period=args.sync_period).run)
    log.info("starting", version=__version__, namespace=args.namespace or "*",
             leader_elect=args.leader_elect, workers=workers)
    # The manager starts the recorder, and flushes it once the workers that feed it stopped.
    try:
        return manager.run(stop)
    finally:
        client.close()


def _allowed_api_urls(args: argparse.Namespace) -> list[str]:
    """The --allowed-api-urls entries, checked: ConfigError (one line, exit 1) for the
    install placeholder, a list with no entry, an entry that is not a URL, or plain http
    without the flag. Unrestricted only when the flag is absent: an empty value is an
    install gone wrong (``make deploy HIMITSU_API_URLS=,``), never a choice."""
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
                         user_agent=f"himitsu-controller/{__version__} metrics-auth")
    return SecureServing(tls=cert.current, authorize=ScrapeAuthorizer(reviews).authorize)


def elector_client(config: ClientConfig) -> RestClient:
    """The elector's own client: a renewal never waits behind reconcile traffic in the
    rate limiter, nothing retries behind its back (no urllib3 retry, no 429 sleep), and
    each request's timeout bounds the whole request (not each socket operation), so each
    request of a renewal keeps to the renew deadline."""
    return RestClient(new_api_client(config, pool_maxsize=2, retries=0), max_retries=0,
                      request_deadlines=True,
                      user_agent=f"himitsu-controller/{__version__} leader-election")


def _wire_events(ctrl: Controller, hsecs: Informer, secrets: Informer) -> None:
    """Enqueue rules: spec changes and force-sync, and any event on a target Secret.

    Status writes change neither generation nor annotations, so our own status patches
    never trigger a reconcile. When a HimitsuSecret goes away, the others naming the same
    target are woken: one of them may have lost a TargetConflict to it.
    """
    _attach(hsecs, handler.enqueue_for_object(
        ctrl, update_predicate=handler.any_of(
            handler.generation_changed, handler.annotation_changed(api.ANN_FORCE_SYNC)),
    ))

    def wake_rivals(obj: dict[str, Any]) -> None:
        for key in _target_index(obj):
            for rival in hsecs.store.by_index(TARGET_INDEX, key):
                ctrl.enqueue(handler.object_key(rival))

    hsecs.add_handler(on_delete=wake_rivals)

    def claimants(secret: dict[str, Any]) -> list[str]:
        meta = secret.get("metadata") or {}
        key = f"{meta.get('namespace', '')}/{meta.get('name', '')}"
        return [handler.object_key(o) for o in hsecs.store.by_index(TARGET_INDEX, key)]

    _attach(secrets, handler.enqueue_mapped(ctrl, claimants))


def _forget_tokens_with_their_users(hsecs: Informer, kube_client: kube.KubeClient) -> None:
    """A token value stays cached only while some HimitsuSecret names its Secret and key.

    The store has already dropped (or replaced) the object when these handlers run, so
    the index answers whether anything else still names that token.
    """
    def still_named(ref: str) -> bool:
        return bool(hsecs.store.by_index(AUTH_INDEX, ref))

    kube_client.track_token_users(still_named)
    hsecs.add_handler(
        on_update=lambda old, new: kube_client.forget_token_of(old, still_named=still_named),
        on_delete=lambda obj: kube_client.forget_token_of(obj, still_named=still_named))


def _attach(informer: Informer, handlers: handler.Handlers) -> None:
    informer.add_handler(
        on_add=handlers.on_add, on_update=handlers.on_update, on_delete=handlers.on_delete)


def _target_index(obj: dict[str, Any]) -> list[str]:
    namespace = (obj.get("metadata") or {}).get("namespace", "")
    target = ((obj.get("spec") or {}).get("target") or {}).get("name")
    return [f"{namespace}/{target}"] if isinstance(target, str) and target else []


def _leader_election(rest: RestClient, args: argparse.Namespace, gate: WriteGate) -> Any:
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

    def factory(on_started: Any, on_stopped: Any) -> LeaderElector:
        return LeaderElector(rest, config, on_started_leading=on_started,
                             on_stopped_leading=on_stopped, gate=gate)

    return factory


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
    """One line and exit when our CRD is not there or we are refused (401, 403); while the
    apiserver is unreachable or answers 5xx/429, wait for it with a backoff for up to
    STARTUP_API_WAIT, saying why in the log, then give up the same way."""
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
