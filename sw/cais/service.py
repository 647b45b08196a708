"""cais-controller: the control plane as a service (docs/controller.md).

::

    cais-controller --switch /run/cais/switch.sock --listen /run/cais/controller.sock \\
                    --http 127.0.0.1:7720 --world-size 4 --token-file /run/cais/token

One process holds the :class:`cais.controller.Controller` (groups, rules, slot quotas, the offload
decisions, re-evaluated every ``reevaluate_interval_ms`` by a background thread) and programs the switch
through cais-switch's control endpoint. It listens twice:

- ``--listen``: the ranks' JSON-lines endpoint (:class:`cais.coordinator.Coordinator`: hello, group,
  decide, finished, ...), a Unix socket path (it reaches across network namespaces) or HOST:PORT;
- ``--http``: HTTP + JSON for operators and :mod:`cais.admin` (``cais-cli``), and the Prometheus text
  endpoint ``/metrics`` (prometheus_client), on loopback. The server is the standard library's
  :class:`http.server.ThreadingHTTPServer`: one thread per request, no dependency beyond
  prometheus_client. Routes::

      GET    /v1/health            switch backend, groups, uptime
      GET    /v1/stats             Controller.stats() of the last evaluation, with P50/P99
      GET    /v1/jobs              running jobs (hosts, ranks joined, groups: switch or host ring and
                                   why) and the latest ended ones (ended or failed)
      GET    /v1/groups            per group: ranks, quota, rule, kind, accounting
      GET    /v1/rules             every rule the controller programmed (the table is write only)
      POST   /v1/rules             {"index": N, "rule": {...}}  an operator rule (cais.admin.rule_from_dict)
      DELETE /v1/rules/N           an operator rule
      GET    /metrics              Prometheus text format

Both endpoints want the shared secret (``--token-file`` or ``CAIS_TOKEN``): HTTP as
``Authorization: Bearer <token>``, the ranks as ``"token"`` in every request. A request without it or
with another is refused (HTTP 401) and counted (``cais_requests_refused_total``), and changes nothing;
so is every malformed or out-of-range request (400, 404, 405, 409, 413), with a one-line JSON error.

``--recover`` starts after a restart: no group is created; the ranks' ``rejoin`` (their groups, with the
next collective and sequence number) brings every group back, and the counters' baselines are read from
the switch's registers (:meth:`cais.controller.Controller.start`).
"""

from __future__ import annotations

import hmac
import json
import logging
import re
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler

from . import cli
from .config import Config
from .controller import RuleConflict
from .coordinator import Coordinator
from .endpoint import HTTP_IDLE_S, EndpointError, GuardedHTTPServer, parse_address, read_token
from .link import run_sync
from .protocol import DropReason

__all__ = ["ControllerService", "MetricsCollector", "main", "http_target", "MAX_BODY"]

log = logging.getLogger("cais.service")

MAX_BODY = 64 * 1024           # bytes of a request body; more is refused (413)
# histogram buckets, seconds: a frame round trip on a veth pair is ~50 us, a collective ms to s
QUEUE_BUCKETS = (1e-5, 2e-5, 5e-5, 1e-4, 2e-4, 5e-4, 1e-3, 2e-3, 5e-3, 1e-2, 5e-2, 0.1, 1.0)
LATENCY_BUCKETS = (1e-4, 5e-4, 1e-3, 2e-3, 5e-3, 1e-2, 2e-2, 5e-2, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0)


def http_target(text: str) -> tuple[str, int]:
    """(host, port) of ``127.0.0.1:PORT`` (port 0: any free one); ValueError otherwise."""
    host, sep, port = str(text).removeprefix("tcp:").rpartition(":")
    if host not in ("127.0.0.1", "localhost"):
        raise ValueError(f"{text!r}: the HTTP endpoint listens on 127.0.0.1:PORT only")
    if not port.isdigit() or not 0 <= int(port) < 65536:
        raise ValueError(f"{text!r}: port {port!r} is not in 0..65535")
    return host, int(port)


class MetricsCollector:
    """A prometheus_client collector that turns the controller's statistics into metric families at
    every scrape (gauges and counters), beside the two histograms the service observes as samples come.

    Members
    -------
    service : ControllerService
    """

    def __init__(self, service: "ControllerService"):
        self.service = service

    def describe(self):
        return []

    def collect(self):
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
        svc = self.service
        with svc.lock:
            st = svc.controller.stats()
            groups = {g: svc.controller.group_counters(g) for g in sorted(svc.controller.groups)}
            refused = dict(svc.refused_all())
            sets = 2 * svc.controller.params.slots
            jobs = svc.coordinator.jobs_view()
            rules_in_use = len(svc.controller.dump_rules())
            slots_allocated = svc.controller.slots_allocated
        counters = st.get("counters", {})
        g = GaugeMetricFamily("cais_sets_in_use", "Shadow sets holding a chunk (SLOTS_IN_USE)")
        g.add_metric([], counters.get("SLOTS_IN_USE", 0))
        yield g
        g = GaugeMetricFamily("cais_sets", "Shadow sets of the switch (2 per slot)")
        g.add_metric([], sets)
        yield g
        for key, what, value in (
                ("sets_allocated", "Shadow sets in the group's quota (2 per slot)", lambda c: c["sets_allocated"]),
                ("sets_in_use", "Shadow sets of the group holding a chunk (SETS_IN_USE of its rule entry)",
                 lambda c: c["sets_in_use"]),
                ("ranks_dropped", "Ranks the controller dropped from the group as dead", lambda c: len(c["dropped"]))):
            g = GaugeMetricFamily(f"cais_group_{key}", what, labels=["group"])
            for gid, gc in groups.items():
                g.add_metric([str(gid)], value(gc))
            yield g
        c = CounterMetricFamily("cais_sets_aged", "Sets the switch aged (AGED_TOTAL)")
        c.add_metric([], counters.get("AGED_TOTAL", 0))
        yield c
        c = CounterMetricFamily("cais_aged_events_lost", "Aged sets whose event the switch's queue had no room for "
                                "(AGED_LOST)")
        c.add_metric([], counters.get("AGED_LOST", 0))
        yield c
        g = GaugeMetricFamily("cais_reduce_throughput_bytes_per_second",
                              "Bytes reduced by the switch per second over the last evaluation interval")
        g.add_metric([], st.get("reduce_throughput_Bps", 0.0))
        yield g
        g = GaugeMetricFamily("cais_fallback_ratio", "Offloaded collectives that fell back / offloaded")
        g.add_metric([], st.get("fallback_ratio", 0.0))
        yield g
        g = GaugeMetricFamily("cais_offload_threshold", "The offload score threshold in force")
        g.add_metric([], st.get("threshold", svc.controller.threshold))
        yield g
        g = GaugeMetricFamily("cais_alert_active", "1 while the alert is above its threshold", labels=["alert"])
        for a in svc.controller.alerts.values():
            g.add_metric([a.name], float(a.active))
        yield g
        c = CounterMetricFamily("cais_bytes_reduced", "Bytes of offloaded collectives reduced by the switch")
        c.add_metric([], st.get("bytes_reduced", 0))
        yield c
        c = CounterMetricFamily("cais_drops", "Frames the switch dropped, by reason (wraps at 2**32)",
                                labels=["reason"])
        for r in DropReason:
            c.add_metric([r.name], counters.get(f"DROP_{r.name}", 0))
        yield c
        for name, reg, what in (("rx_frames", "RX_FRAMES", "Frames received"), ("rx_bytes", "RX_BYTES", "Bytes received"),
                                ("tx_frames", "TX_FRAMES", "Frames sent"), ("tx_bytes", "TX_BYTES", "Bytes sent")):
            c = CounterMetricFamily(f"cais_port_{name}", f"{what} per switch port (wraps at 2**32)", labels=["port"])
            for p, v in enumerate(counters.get(reg, [])):
                c.add_metric([str(p)], v)
            yield c
        for key, what in (("contributions", "Contributions the switch accepted for the group's chunks"),
                          ("completions", "Chunks of the group the switch completed"),
                          ("collectives", "Collectives of the group finished on every rank"),
                          ("offloaded", "Of which offloaded to the switch"),
                          ("fell_back", "Of which fell back to the host ring"),
                          ("bytes_reduced", "Bytes of the group reduced by the switch"),
                          ("sets_aged", "Sets of the group the switch aged (AGED of its rule entry)")):
            c = CounterMetricFamily(f"cais_group_{key}", what, labels=["group"])
            for gid, gc in groups.items():
                c.add_metric([str(gid)], gc[key])
            yield c
        g = GaugeMetricFamily("cais_jobs", "Jobs running on the controller, by state", labels=["state"])
        for state in ("running", "failing", "idle"):
            g.add_metric([state], sum(j["state"] == state for j in jobs["jobs"]))
        yield g
        g = GaugeMetricFamily("cais_job_groups_host_ring", "Groups of a running job that run on the host ring, "
                              "by why (no rule entry or slots left)", labels=["job", "reason"])
        for j in jobs["jobs"]:
            reasons: dict[str, int] = {}
            for grp in j["groups"]:
                if grp["why_not"]:
                    reasons[grp["why_not"]] = reasons.get(grp["why_not"], 0) + 1
            for why, n in sorted(reasons.items()):
                g.add_metric([j["job"], why], n)
        yield g
        g = GaugeMetricFamily("cais_rules_in_use", "Rule entries the controller holds (groups' and operator rules)")
        g.add_metric([], rules_in_use)
        yield g
        g = GaugeMetricFamily("cais_slots_allocated", "Slots in the quotas of the groups and operator rules")
        g.add_metric([], slots_allocated)
        yield g
        c = CounterMetricFamily("cais_requests_refused", "Requests refused, by endpoint and reason",
                                labels=["endpoint", "reason"])
        for (endpoint, reason), n in sorted(refused.items()):
            c.add_metric([endpoint, reason], n)
        yield c


class ControllerService:
    """The controller, its rank endpoint, its HTTP endpoint and its periodic evaluation (module docstring).

    Members
    -------
    coordinator : Coordinator
        The ranks' endpoint and the controller behind it.
    controller : cais.controller.Controller
    lock : threading.Condition
        Held around every use of the controller (the coordinator's).
    http_refused : dict[str, int]
        HTTP requests refused, by reason (token, bad_request, not_found, method, conflict, too_large).
    """

    def __init__(self, switch: str, world_size: int, config: Config, *, token: str | None,
                 recover: bool = False, switch_retry_s: float = 0.0):
        from prometheus_client import CollectorRegistry, Histogram
        self.token = token
        self.coordinator = Coordinator(switch, world_size, config, token=token, recover=recover,
                                       switch_retry_s=switch_retry_s)
        self.controller = self.coordinator.controller
        self.lock = self.coordinator._lock
        self.http_refused: dict[str, int] = {}
        self._t0 = time.monotonic()
        self.registry = CollectorRegistry()
        self.queue_hist = Histogram("cais_queue_delay_seconds", "First-chunk round trip minus the smallest",
                                    buckets=QUEUE_BUCKETS, registry=self.registry)
        self.latency_hist = Histogram("cais_collective_latency_seconds",
                                      "All-reduce latency: first decision to the last rank's finished",
                                      buckets=LATENCY_BUCKETS, registry=self.registry)
        self.controller.queue_delay.listeners.append(self.queue_hist.observe)
        self.controller.latency.listeners.append(self.latency_hist.observe)
        self.registry.register(MetricsCollector(self))
        self._http = None
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        with self.lock:
            run_sync(self.controller.evaluate(self.coordinator.now()))

    def refused_all(self) -> dict[tuple[str, str], int]:
        out = {("http", k): v for k, v in self.http_refused.items()}
        out.update({("ranks", k): v for k, v in self.coordinator.refused.items()})
        return out

    def refuse(self, reason: str) -> None:
        with self.lock:
            self.http_refused[reason] = self.http_refused.get(reason, 0) + 1

    # ------------------------------------------------------------------ lifecycle
    def serve(self, ranks_address: str, http_address: str) -> None:
        """Listen for ranks and for HTTP, start the periodic evaluation (returns at once)."""
        # capped connections, idle ones closed, EMFILE survived (cais.endpoint; docs/security.md)
        self._http = GuardedHTTPServer(http_target(http_address), _handler(self))
        self.http_port = self._http.server_address[1]
        self.coordinator.serve(ranks_address)
        for target, name in ((self._http.serve_forever, "cais-http"), (self._evaluate_loop, "cais-evaluate")):
            t = threading.Thread(target=target, name=name, daemon=True)
            t.start()
            self._threads.append(t)

    def _evaluate_loop(self) -> None:
        period = self.controller.config.reevaluate_interval_ms / 1000.0
        while not self._stop.wait(period):
            try:
                with self.lock:
                    run_sync(self.controller.service(self.coordinator.now()))
            except (EndpointError, OSError) as e:
                log.error("evaluation: the switch's control endpoint: %s", e)

    def close(self) -> None:
        self._stop.set()
        if self._http is not None:
            self._http.shutdown()
            self._http.server_close()
        self.coordinator.close()

    # ------------------------------------------------------------------ the HTTP API
    def api(self, method: str, path: str, body: bytes | None) -> tuple[int, dict]:
        """One authorised request -> (status, JSON answer). Refusals change nothing."""
        from .admin import rule_from_dict, rule_to_dict
        ctl = self.controller
        if path == "/v1/health" and method == "GET":
            return 200, {"ok": True, "backend": self.coordinator.link.backend, "groups": len(ctl.groups),
                         "uptime_s": time.monotonic() - self._t0, "recovering": self.coordinator.recovering,
                         "jobs": len(self.coordinator.jobs)}
        if path == "/v1/stats" and method == "GET":
            with self.lock:
                st = ctl.stats()
            st.pop("counters", None)
            return 200, {"ok": True, "stats": st, "refused": {f"{e}:{r}": n for (e, r), n in self.refused_all().items()}}
        if path == "/v1/jobs" and method == "GET":
            with self.lock:
                return 200, {"ok": True, **self.coordinator.jobs_view()}
        if path == "/v1/groups" and method == "GET":
            with self.lock:
                return 200, {"ok": True, "groups": [ctl.group_counters(g) for g in sorted(ctl.groups)]}
        if path == "/v1/rules" and method == "GET":
            with self.lock:
                return 200, {"ok": True, "rules": [{"index": i, "owner": o, "rule": rule_to_dict(r)}
                                                   for i, o, r in ctl.dump_rules()]}
        if path == "/v1/rules" and method == "POST":
            try:
                req = json.loads(body or b"")
            except (ValueError, UnicodeDecodeError) as e:
                return self._bad("bad_request", 400, f"the body is not JSON ({e})")
            if not isinstance(req, dict) or set(req) != {"index", "rule"}:
                return self._bad("bad_request", 400, 'the body must be {"index": N, "rule": {...}}')
            index = req["index"]
            if isinstance(index, bool) or not isinstance(index, int):
                return self._bad("bad_request", 400, f"index {index!r}: must be an integer")
            try:
                rule = rule_from_dict(req["rule"])
            except ValueError as e:
                return self._bad("bad_request", 400, str(e))
            with self.lock:
                try:
                    ctl.check_rule(index, rule)
                except RuleConflict as e:
                    return self._bad("conflict", 409, str(e))
                except ValueError as e:
                    return self._bad("bad_request", 400, str(e))
                run_sync(ctl.add_rule(index, rule))
            return 201, {"ok": True, "index": index, "rule": rule_to_dict(rule)}
        m = re.fullmatch(r"/v1/rules/([^/]+)", path)
        if m and method == "DELETE":
            try:
                index = int(m.group(1), 10)
            except ValueError:
                return self._bad("bad_request", 400, f"rule index {m.group(1)!r}: not an integer")
            with self.lock:
                try:
                    rule = run_sync(ctl.del_rule(index))
                except KeyError as e:
                    return self._bad("not_found", 404, str(e.args[0]))
                except RuleConflict as e:
                    return self._bad("conflict", 409, str(e))
                except ValueError as e:
                    return self._bad("bad_request", 400, str(e))
            return 200, {"ok": True, "index": index, "rule": rule_to_dict(rule)}
        if path in ("/v1/health", "/v1/stats", "/v1/jobs", "/v1/groups", "/v1/rules", "/metrics") or m:
            return self._bad("method", 405, f"{method} {path}: method not allowed")
        return self._bad("not_found", 404, f"{path}: no such resource")

    def _bad(self, reason: str, status: int, message: str) -> tuple[int, dict]:
        self.refuse(reason)
        return status, {"ok": False, "error": message}

    def authorised(self, header: str | None) -> bool:
        if self.token is None:
            return True
        if not header or not header.startswith("Bearer "):
            return False
        return hmac.compare_digest(header[7:].strip().encode(), self.token.encode())


def _handler(service: ControllerService):
    class Handler(BaseHTTPRequestHandler):
        server_version = "cais-controller"
        protocol_version = "HTTP/1.1"
        timeout = HTTP_IDLE_S

        def log_message(self, fmt, *args):       # quiet: the service logs what matters
            log.debug("http: " + fmt, *args)

        def _send(self, status: int, payload, content_type="application/json"):
            data = payload if isinstance(payload, bytes) else (json.dumps(payload) + "\n").encode()
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _handle(self, method: str):
            body = None
            try:
                length = int(self.headers.get("Content-Length") or 0)
            except ValueError:
                length = -1
            if not 0 <= length <= MAX_BODY:
                service.refuse("too_large" if length > MAX_BODY else "bad_request")
                self.close_connection = True
                return self._send(413 if length > MAX_BODY else 400,
                                  {"ok": False, "error": f"body of {length} bytes: at most {MAX_BODY}"})
            if length:
                body = self.rfile.read(length)
            if not service.authorised(self.headers.get("Authorization")):
                service.refuse("token")
                log.warning("http: refused %s %s without the token", method, self.path)
                return self._send(401, {"ok": False, "error": "unauthorised: missing or wrong token "
                                                              "(Authorization: Bearer ...; cais-cli: --token-file "
                                                              "or CAIS_TOKEN)"})
            path = self.path.split("?", 1)[0]
            if path == "/metrics" and method == "GET":
                from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
                return self._send(200, generate_latest(service.registry), CONTENT_TYPE_LATEST)
            try:
                status, answer = service.api(method, path, body)
            except (EndpointError, OSError) as e:
                status, answer = 503, {"ok": False, "error": f"the switch's control endpoint: {e}"}
            self._send(status, answer)

        def do_GET(self):
            self._handle("GET")

        def do_POST(self):
            self._handle("POST")

        def do_DELETE(self):
            self._handle("DELETE")

        def do_PUT(self):
            self._handle("PUT")

        def do_PATCH(self):
            self._handle("PATCH")
    return Handler


def main(argv=None) -> int:
    p = cli.Parser(prog="cais-controller", description="The CAIS control plane as a service: groups, rules, "
                   "offload decisions, the ranks' endpoint, an HTTP+JSON API and Prometheus metrics.")
    p.add_argument("--switch", required=True, metavar="ADDR", help="cais-switch's control endpoint")
    p.add_argument("--listen", default=None, metavar="ADDR", help="where ranks reach the controller (default: "
                   "the configuration's controller_address:controller_port, as cais.init's default)")
    p.add_argument("--http", required=True, metavar="127.0.0.1:PORT", help="HTTP API and /metrics (loopback)")
    p.add_argument("--world-size", required=True, type=cli.integer(1))
    p.add_argument("--config", default=None, metavar="TOML")
    p.add_argument("--token-file", default=None, metavar="PATH", help="the shared secret (default: $CAIS_TOKEN)")
    p.add_argument("--recover", action="store_true", help="after a restart: groups come back with the ranks")
    p.add_argument("--ready-file", default=None, metavar="PATH", help="written (HTTP port) once listening")
    p.add_argument("--switch-wait", type=cli.number(0, 3600), default=10.0, metavar="S",
                   help="wait this long for the switch's endpoint (default 10)")
    cli.add_version(p)
    args = p.parse_args(argv)
    try:
        config = Config.load(args.config)
    except (OSError, ValueError) as e:
        p.error(f"--config: {e}")
    if args.listen is None:
        args.listen = f"{config.controller_address}:{config.controller_port}"
    for flag, value, check in (("--listen", args.listen, parse_address), ("--http", args.http, http_target),
                               ("--switch", args.switch, parse_address)):
        try:
            check(value)
        except ValueError as e:
            p.error(f"{flag} {e}")
    try:
        token = read_token(args.token_file)
    except (OSError, ValueError) as e:
        p.error(f"--token-file: {e}")
    if token is None:
        p.error("a token is required: --token-file PATH or CAIS_TOKEN")
    logging.basicConfig(level=logging.INFO, format="cais-controller: %(levelname)s %(message)s")
    try:
        svc = ControllerService(args.switch, args.world_size, config, token=token,
                                recover=args.recover, switch_retry_s=args.switch_wait)
        svc.serve(args.listen, args.http)
    except (EndpointError, ValueError, OSError, RuntimeError) as e:
        print(f"cais-controller: error: {e}", file=sys.stderr)
        return 2
    import signal
    stop = threading.Event()
    for s in (signal.SIGTERM, signal.SIGINT):
        signal.signal(s, lambda *_: stop.set())
    print(f"cais-controller: ranks on {args.listen}, HTTP on 127.0.0.1:{svc.http_port}"
          + (" (recovering)" if args.recover else ""), file=sys.stderr, flush=True)
    if args.ready_file:
        with open(args.ready_file, "w") as f:
            f.write(f"{svc.http_port}\n")
    try:
        stop.wait()
    finally:
        svc.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
