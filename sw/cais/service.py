"""cais-controller: the control plane as a service (docs/controller.md).

::

    cais-controller --switch /run/cais/switch.sock --listen /run/cais/controller.sock \\
                    --http 127.0.0.1:7720 --world-size 4 --token-file /run/cais/token

One process holds the :class:`cais.controller.Controller` (groups, rules, slot quotas, the offload
decisions, re-evaluated every ``reevaluate_interval_ms`` by a background thread) and programs the switch
through cais-switch's control endpoint. It listens twice:

- ``--listen``: the ranks' JSON-lines endpoint (:class:`cais.coordinator.Coordinator`: hello, group,
  decide, finished, ...), a Unix socket path (it reaches across network namespaces) or HOST:PORT;
- ``--http``: HTTP + JSON for operators and :mod:`cais.cli` (``cais-cli``), and the Prometheus text
  endpoint ``/metrics`` (prometheus_client), on loopback. The server is the standard library's
  :class:`http.server.ThreadingHTTPServer`: one thread per request, no dependency beyond
  prometheus_client. Routes::

      GET    /v1/health            switch backend, groups, uptime
      GET    /v1/stats             Controller.stats() of the last evaluation, with P50/P99
      GET    /v1/jobs              running jobs (hosts, ranks joined, groups: switch or host ring and
                                   why) and the latest ended ones (ended or failed)
      GET    /v1/groups            per group: ranks, quota, rule, kind, accounting
      GET    /v1/decisions         the latest offload decisions (?last=N, default 50) with score,
                                   threshold and reason, and the tally by path and reason code
      GET    /v1/rules             every rule the controller programmed (the table is write only)
      POST   /v1/rules             {"index": N, "rule": {...}}  an operator rule (cais.cli.rule_from_dict)
      DELETE /v1/rules/N           an operator rule
      GET    /metrics              Prometheus text format

``--metrics-listen HOST:PORT`` adds a listener that serves ``/metrics`` only (any address: a Prometheus on
another host), and ``--metrics-no-token`` lets ``/metrics`` (on either listener) be read without the
token; the API always wants it (docs/controller.md, "Metrics for a remote Prometheus").

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
import socket
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler

from . import cmdline
from .config import Config
from .controller import Reason, RuleConflict
from .controller.statistics import COLLECTIVE_PATHS
from .controller.switch import check_switch_address
from .coordinator import Coordinator
from .endpoint import (HTTP_IDLE_S, EndpointError, GuardedHTTPServer, WarningLimiter, decode, parse_address, printable,
                       read_token)
from .link import run_sync
from .protocol import DropReason

__all__ = ["ControllerService", "MetricsCollector", "main", "http_target", "metrics_target", "MAX_BODY"]

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


def metrics_target(text: str) -> tuple[str, int]:
    """(host, port) of ``HOST:PORT`` (``[::1]:PORT`` for IPv6; port 0: any free one); ValueError otherwise."""
    host, sep, port = str(text).removeprefix("tcp:").rpartition(":")
    host = host.removeprefix("[").removesuffix("]")
    if not sep or not host:
        raise ValueError(f"{text!r}: HOST:PORT (e.g. 0.0.0.0:9720)")
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
            stats = svc.controller.statistics
            collectives, nbytes = dict(stats.collectives), dict(stats.bytes)
            tally = dict(svc.controller.policy.tally)
            evaluation_errors = svc.evaluation_errors
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
        c = CounterMetricFamily("cais_collectives", "Collectives finished on every rank, by where they ran "
                                "(switch; fallback: offloaded, then redone on the host ring; host)", labels=["path"])
        for path in COLLECTIVE_PATHS:
            c.add_metric([path], collectives[path])
        yield c
        c = CounterMetricFamily("cais_collective_bytes", "Wire bytes of the collectives finished on every rank, "
                                "by where they ran (path=switch: the bytes the switch reduced)", labels=["path"])
        for path in COLLECTIVE_PATHS:
            c.add_metric([path], nbytes[path])
        yield c
        c = CounterMetricFamily("cais_offload_decisions", "Offload decisions, by path and reason code",
                                labels=["path", "reason"])
        for reason in Reason:
            c.add_metric([reason.path, reason.value], tally.get((reason.path, reason.value), 0))
        yield c
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
        c = CounterMetricFamily("cais_drops", "Frames the switch dropped, by reason",
                                labels=["reason"])
        for r in DropReason:
            c.add_metric([r.name], counters.get(f"DROP_{r.name}", 0))
        yield c
        for name, reg, what in (("rx_frames", "RX_FRAMES", "Frames received"), ("rx_bytes", "RX_BYTES", "Bytes received"),
                                ("tx_frames", "TX_FRAMES", "Frames sent"), ("tx_bytes", "TX_BYTES", "Bytes sent")):
            c = CounterMetricFamily(f"cais_port_{name}", f"{what} per switch port", labels=["port"])
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
                              "by reason code (no_rule_entry, no_slots, host_only_before_restart)",
                              labels=["job", "reason"])
        for j in jobs["jobs"]:
            reasons: dict[str, int] = {}
            for grp in j["groups"]:
                if grp["host_reason"]:
                    reasons[grp["host_reason"]] = reasons.get(grp["host_reason"], 0) + 1
            for why, n in sorted(reasons.items()):
                g.add_metric([j["job"], why], n)
        yield g
        g = GaugeMetricFamily("cais_rules_in_use", "Rule entries the controller holds (groups' and operator rules)")
        g.add_metric([], rules_in_use)
        yield g
        g = GaugeMetricFamily("cais_slots_allocated", "Slots in the quotas of the groups and operator rules")
        g.add_metric([], slots_allocated)
        yield g
        c = CounterMetricFamily("cais_evaluation_errors", "Periodic evaluations that failed (a switch request "
                                "without an answer, ...); each is logged and the next one follows")
        c.add_metric([], evaluation_errors)
        yield c
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
    lock : cais.locks.ReentrantLock
        Held around every use of the controller's state (the coordinator's), but never while the switch is
        asked something: work that talks to the switch holds ``switch_lock`` first and gives ``lock`` up
        while it waits for each answer (:attr:`cais.coordinator.Coordinator.switch_lock`). /metrics and the
        HTTP views take ``lock`` alone, so a slow switch holds them up by one Python step at most.
    switch_lock : cais.locks.ReentrantLock
        The coordinator's: serializes the work that may talk to the switch.
    evaluation_errors : int
        Periodic evaluations that failed (logged; the loop goes on).
    http_refused : dict[str, int]
        HTTP requests refused, by reason (token, bad_request, not_found, method, conflict, too_large,
        chunked).
    token_warnings : cais.endpoint.WarningLimiter
        Rate-limits the warning logged for a request without the token.
    """

    def __init__(self, switch: str, world_size: int, config: Config, *, token: str | None,
                 recover: bool = False, switch_retry_s: float = 0.0, metrics_no_token: bool = False):
        from prometheus_client import CollectorRegistry, Histogram, disable_created_metrics
        disable_created_metrics()      # no *_created series: they are not counts, and rate() has no use for them
        self.token = token
        self.metrics_no_token = metrics_no_token
        self.coordinator = Coordinator(switch, world_size, config, token=token, recover=recover,
                                       switch_retry_s=switch_retry_s)
        self.controller = self.coordinator.controller
        self.lock = self.coordinator._lock
        self.switch_lock = self.coordinator.switch_lock
        self.http_refused: dict[str, int] = {}
        self.token_warnings = WarningLimiter()       # 401s are logged at most once per WARN_INTERVAL_S
        self.evaluation_errors = 0
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
        self._metrics_http = None
        self.metrics_port = None
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        with self.switch_lock, self.lock:
            run_sync(self.controller.evaluate(self.coordinator.now()))

    def refused_all(self) -> dict[tuple[str, str], int]:
        out = {("http", k): v for k, v in self.http_refused.items()}
        out.update({("ranks", k): v for k, v in self.coordinator.refused.items()})
        return out

    def refuse(self, reason: str) -> None:
        with self.lock:
            self.http_refused[reason] = self.http_refused.get(reason, 0) + 1

    # ------------------------------------------------------------------ lifecycle
    def serve(self, ranks_address: str, http_address: str, metrics_address: str | None = None) -> None:
        """Listen for ranks, for HTTP and (`metrics_address`) for /metrics alone; start the periodic
        evaluation (returns at once)."""
        # capped connections, idle ones closed, EMFILE survived (cais.endpoint; docs/security.md)
        self._http = GuardedHTTPServer(http_target(http_address), _handler(self))
        self.http_port = self._http.server_address[1]
        loops = [(self._http.serve_forever, "cais-http"), (self._evaluate_loop, "cais-evaluate")]
        if metrics_address is not None:
            host, port = metrics_target(metrics_address)
            server_class = GuardedHTTPServer
            if ":" in host:
                class server_class(GuardedHTTPServer):         # noqa: N801 (an IPv6 listener)
                    address_family = socket.AF_INET6
            self._metrics_http = server_class((host, port), _handler(self, metrics_only=True))
            self.metrics_port = self._metrics_http.server_address[1]
            loops.append((self._metrics_http.serve_forever, "cais-metrics"))
        self.coordinator.serve(ranks_address)
        for target, name in loops:
            t = threading.Thread(target=target, name=name, daemon=True)
            t.start()
            self._threads.append(t)

    def _evaluate_loop(self) -> None:
        period = self.controller.config.reevaluate_interval_ms / 1000.0
        while not self._stop.wait(period):
            self.evaluate_once()

    def evaluate_once(self) -> bool:
        """One pass of the periodic work: the reads without the lock (a switch that answers late holds up
        no rank request and no /metrics scrape), then the state changes under it. An error is logged and
        counted (``evaluation_errors``), never raised: the loop goes on with the next pass."""
        try:
            now = self.coordinator.now()
            pre = run_sync(self.controller.prefetch(now))
            with self.switch_lock, self.lock:
                run_sync(self.controller.service(now, pre))
            return True
        except Exception as e:      # noqa: BLE001 (any one failure: the loop must outlive it)
            self.evaluation_errors += 1
            what = "the switch's control endpoint" if isinstance(e, (EndpointError, OSError)) else type(e).__name__
            log.error("evaluation failed (%s: %s); the next one follows", what, e)
            return False

    def close(self) -> None:
        self._stop.set()
        for server in (self._http, self._metrics_http):
            if server is not None:
                server.shutdown()
                server.server_close()
        self.coordinator.close()

    # ------------------------------------------------------------------ the HTTP API
    def decisions_view(self, query: str = "") -> dict:
        """The latest decisions (``last=N``, default 50, at most DECISIONS_KEPT), each with its job, and the
        tally by path and reason code (/v1/decisions, cais-cli show-decisions)."""
        from urllib.parse import parse_qs
        last = parse_qs(query).get("last", ["50"])[-1]
        if not last.isdigit():
            raise ValueError(f"last={last!r}: a number of decisions")
        with self.lock:
            ctl = self.controller
            job_of = {g: j.name for j in self.coordinator.jobs.values() for g in j.groups}
            recent = list(ctl.decisions)[-int(last):] if int(last) else []
            return {"decisions": [{"time_s": t, "job": job_of.get(g), "group": g, "op_seq": s, **d.as_dict()}
                                  for t, g, s, d in recent],
                    "total": ctl.decision_count, "threshold": ctl.threshold, "offload": ctl.config.offload,
                    "tally": [{"path": p, "reason": r, "count": n} for (p, r), n in sorted(ctl.policy.tally.items())]}

    def api(self, method: str, path: str, body: bytes | None, query: str = "") -> tuple[int, dict]:
        """One authorised request -> (status, JSON answer). Refusals change nothing."""
        from .cli import rule_from_dict, rule_to_dict
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
        if path == "/v1/decisions" and method == "GET":
            return 200, {"ok": True, **self.decisions_view(query)}
        if path == "/v1/rules" and method == "GET":
            with self.lock:
                return 200, {"ok": True, "rules": [{"index": i, "owner": o, "rule": rule_to_dict(r)}
                                                   for i, o, r in ctl.dump_rules()]}
        if path == "/v1/rules" and method == "POST":
            try:
                req = decode(body or b"")         # nesting capped (MAX_DEPTH) without letting the parser recurse
            except ValueError as e:
                return self._bad("bad_request", 400, f'the body must be {{"index": N, "rule": {{...}}}}: {e}')
            if set(req) != {"index", "rule"}:
                return self._bad("bad_request", 400, 'the body must be {"index": N, "rule": {...}}')
            index = req["index"]
            if isinstance(index, bool) or not isinstance(index, int):
                return self._bad("bad_request", 400, f"index {index!r}: must be an integer")
            try:
                rule = rule_from_dict(req["rule"])
            except ValueError as e:
                return self._bad("bad_request", 400, str(e))
            with self.switch_lock, self.lock:
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
            with self.switch_lock, self.lock:
                try:
                    rule = run_sync(ctl.del_rule(index))
                except KeyError as e:
                    return self._bad("not_found", 404, str(e.args[0]))
                except RuleConflict as e:
                    return self._bad("conflict", 409, str(e))
                except ValueError as e:
                    return self._bad("bad_request", 400, str(e))
            return 200, {"ok": True, "index": index, "rule": rule_to_dict(rule)}
        if path in ("/v1/health", "/v1/stats", "/v1/jobs", "/v1/groups", "/v1/decisions", "/v1/rules",
                    "/metrics") or m:
            return self._bad("method", 405, f"{method} {path}: method not allowed")
        return self._bad("not_found", 404, f"{path}: no such resource")

    def _bad(self, reason: str, status: int, message: str) -> tuple[int, dict]:
        self.refuse(reason)
        return status, {"ok": False, "error": message}

    def authorised(self, header: str | None, path: str = "") -> bool:
        if self.token is None or (path == "/metrics" and self.metrics_no_token):
            return True
        if not header or not header.startswith("Bearer "):
            return False
        return hmac.compare_digest(header[7:].strip().encode(), self.token.encode())


def _handler(service: ControllerService, metrics_only: bool = False):
    """The request handler: the API and /metrics, or (`metrics_only`) /metrics alone."""
    class Handler(BaseHTTPRequestHandler):
        server_version = "cais-controller"
        protocol_version = "HTTP/1.1"
        timeout = HTTP_IDLE_S

        def log_message(self, fmt, *args):       # quiet: the service logs what matters
            log.debug("http: " + fmt, *(printable(a) for a in args))

        def _send(self, status: int, payload, content_type="application/json"):
            data = payload if isinstance(payload, bytes) else (json.dumps(payload) + "\n").encode()
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _handle(self, method: str):
            body = None
            if self.headers.get("Transfer-Encoding") is not None:
                # a chunked body is not read: the connection ends, so its bytes are never taken for a request
                service.refuse("chunked")
                self.close_connection = True
                return self._send(501, {"ok": False, "error": "Transfer-Encoding is not supported: send the body "
                                                              "with Content-Length"})
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
            path, _, query = self.path.partition("?")
            if metrics_only and path != "/metrics":
                service.refuse("not_found")
                return self._send(404, {"ok": False, "error": f"{path}: this listener serves /metrics only"})
            if not service.authorised(self.headers.get("Authorization"), path):
                service.refuse("token")
                quiet = service.token_warnings.allow()
                if quiet is not None:
                    log.warning("http: refused %s %s without the token%s", method, printable(self.path),
                                f" ({quiet} more refused since the last warning)" if quiet else "")
                return self._send(401, {"ok": False, "error": "unauthorised: missing or wrong token "
                                                              "(Authorization: Bearer ...; cais-cli: --token-file "
                                                              "or CAIS_TOKEN)"})
            if path == "/metrics" and method == "GET":
                from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
                return self._send(200, generate_latest(service.registry), CONTENT_TYPE_LATEST)
            try:
                status, answer = service.api(method, path, body, query)
            except ValueError as e:
                status, answer = service._bad("bad_request", 400, str(e))
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
    p = cmdline.Parser(prog="cais-controller", description="The CAIS control plane as a service: groups, rules, "
                   "offload decisions, the ranks' endpoint, an HTTP+JSON API and Prometheus metrics.")
    p.add_argument("--switch", required=True, action="append", metavar="ADDR",
                   help="cais-switch's control endpoint, or serial:/dev/ttyUSB0[@BAUD] for an FPGA board's UART "
                        "bridge (docs/board.md); with --tree: every switch's, the leaves' then the spine's")
    p.add_argument("--tree", default=None, metavar="LEAVESxRANKS",
                   help="the switches are an aggregation tree: LEAVES leaves of RANKS ranks each (uplink on port "
                        "RANKS) under a spine (docs/controller.md, 'Aggregation trees')")
    p.add_argument("--listen", default=None, metavar="ADDR", help="where ranks reach the controller (default: "
                   "the configuration's controller_address:controller_port, as cais.init's default)")
    p.add_argument("--http", required=True, metavar="127.0.0.1:PORT", help="HTTP API and /metrics (loopback)")
    p.add_argument("--metrics-listen", default=None, metavar="HOST:PORT",
                   help="also serve /metrics (and nothing else) here, e.g. 0.0.0.0:9720 for a Prometheus on "
                        "another host (default: /metrics on --http only)")
    p.add_argument("--metrics-no-token", action="store_true",
                   help="/metrics without the token (the API still wants it)")
    p.add_argument("--world-size", required=True, type=cmdline.integer(1))
    p.add_argument("--config", default=None, metavar="TOML")
    p.add_argument("--token-file", default=None, metavar="PATH", help="the shared secret (default: $CAIS_TOKEN)")
    p.add_argument("--recover", action="store_true", help="after a restart: groups come back with the ranks")
    p.add_argument("--ready-file", default=None, metavar="PATH", help="written (HTTP port) once listening")
    p.add_argument("--switch-wait", type=cmdline.number(0, 3600), default=10.0, metavar="S",
                   help="wait this long for the switch's endpoint (default 10)")
    cmdline.add_version(p)
    args = p.parse_args(argv)
    try:
        config = Config.load(args.config)
    except (OSError, ValueError) as e:
        p.error(f"--config: {e}")
    if args.listen is None:
        args.listen = f"{config.controller_address}:{config.controller_port}"
    for flag, value, check in (("--listen", args.listen, parse_address), ("--http", args.http, http_target),
                               *(("--switch", a, check_switch_address) for a in args.switch),
                               ("--metrics-listen", args.metrics_listen, metrics_target)):
        if value is None:
            continue
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
    tree = None
    if args.tree is not None:
        leaves, _, per_leaf = args.tree.partition("x")
        if not (leaves.isdigit() and per_leaf.isdigit()):
            p.error(f"--tree {args.tree!r}: expected LEAVESxRANKS, e.g. 2x4")
        tree = (int(leaves), int(per_leaf))
        if len(args.switch) != tree[0] + 1:
            p.error(f"--tree {args.tree}: needs {tree[0] + 1} --switch endpoints (the leaves', then the spine's), "
                    f"not {len(args.switch)}")
    elif len(args.switch) > 1:
        p.error("--switch given more than once: only with --tree")
    logging.basicConfig(level=logging.INFO, format="cais-controller: %(levelname)s %(message)s")
    try:
        switch = args.switch[0]
        if tree is not None:
            from .controller.tree import TreeLink
            switch = TreeLink(args.switch, *tree, retry_for=args.switch_wait)
            if switch.problem:
                logging.warning("the tree cannot aggregate (%s): every collective stays on the host ring",
                                switch.problem)
                config = Config.load(args.config, offload="never")
        svc = ControllerService(switch, args.world_size, config, token=token,
                                recover=args.recover, switch_retry_s=args.switch_wait,
                                metrics_no_token=args.metrics_no_token)
        svc.serve(args.listen, args.http, args.metrics_listen)
    except (EndpointError, ValueError, OSError, RuntimeError) as e:
        print(f"cais-controller: error: {e}", file=sys.stderr)
        return 2
    import signal
    stop = threading.Event()
    for s in (signal.SIGTERM, signal.SIGINT):
        signal.signal(s, lambda *_: stop.set())
    metrics = "" if svc.metrics_port is None else f", /metrics on {args.metrics_listen.rpartition(':')[0]}:{svc.metrics_port}"
    print(f"cais-controller: ranks on {args.listen}, HTTP on 127.0.0.1:{svc.http_port}{metrics}"
          + (" (/metrics without the token)" if args.metrics_no_token else "")
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
