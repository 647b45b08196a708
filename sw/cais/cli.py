"""cais-cli: the operator's command line against cais-controller's HTTP API (docs/controller.md).

::

    cais-cli [--controller 127.0.0.1:7720] [--token-file PATH] [--json] COMMAND ...
    cais-cli add-rule 5 --group 200 --contributors 0,1 --base 48 --count-log2 2 --dtype fp16 --op sum
    cais-cli del-rule 5
    cais-cli dump-rules
    cais-cli show-stats
    cais-cli show-groups
    cais-cli show-jobs
    cais-cli show-decisions [--last 20]             (each decision's path, score, threshold and reason)
    cais-cli watch [--interval 1] [--count N]      (a live view, redrawn in place on a terminal)

``--controller`` defaults to ``$CAIS_CONTROLLER_HTTP``, the token to ``$CAIS_TOKEN``. ``--json`` prints
the service's JSON answer instead of a table. Every error is one line on stderr (``cais-cli: error:
...``) with exit status 2 for a bad argument or a refused request, 1 when the service cannot be reached.
"""

from __future__ import annotations

import json
import os
import sys
import time
import urllib.error
import urllib.request

from . import cmdline
from .protocol import DType, ReduceOp
from .tables import Rule

__all__ = ["main", "rule_from_dict", "rule_to_dict", "Client", "ServiceError", "decisions_table"]

RULE_KEYS = ("group", "layer", "chunk", "contributors", "results", "base", "count_log2", "dtype", "red_op",
             "acc_fp32", "saturate", "reproducible")


class ServiceError(Exception):
    """The service refused a request (status >= 400) or could not be reached (status 0)."""

    def __init__(self, message: str, status: int = 0):
        super().__init__(message)
        self.status = status


def _enum(enum, value, what):
    if isinstance(value, str):
        try:
            return enum[value.upper()]
        except KeyError:
            raise ValueError(f"{what} {value!r}: one of {', '.join(m.name.lower() for m in enum)}") from None
    if isinstance(value, bool) or not isinstance(value, int) or value not in set(enum):
        raise ValueError(f"{what} {value!r}: one of {', '.join(m.name.lower() for m in enum)}")
    return enum(value)


def rule_from_dict(d) -> Rule:
    """A :class:`cais.tables.Rule` from its JSON form (:func:`rule_to_dict`); ValueError naming the field
    for anything unknown, missing a value or out of range."""
    if not isinstance(d, dict):
        raise ValueError("rule: must be an object")
    unknown = sorted(set(d) - set(RULE_KEYS))
    if unknown:
        raise ValueError(f"rule: unknown field(s) {', '.join(unknown)} (known: {', '.join(RULE_KEYS)})")
    kw = {}
    for key in ("group", "layer", "chunk"):
        if key in d:
            pair = d[key]
            if not (isinstance(pair, list) and len(pair) == 2):
                raise ValueError(f"rule.{key}={pair!r}: must be [value, mask]")
            kw[key] = tuple(pair)
    for key in ("contributors", "results", "base", "count_log2"):
        if key in d:
            kw[key] = d[key]
    if "dtype" in d:
        kw["dtype"] = _enum(DType, d["dtype"], "rule.dtype")
    if "red_op" in d:
        kw["red_op"] = _enum(ReduceOp, d["red_op"], "rule.red_op")
    for key in ("acc_fp32", "saturate", "reproducible"):
        if key in d:
            kw[key] = d[key]
    if "results" not in kw and "contributors" in kw:
        kw["results"] = kw["contributors"]
    rule = Rule(**kw)                           # Rule's own checks: integers, not negative, enums, booleans
    if rule.count_log2 > 16:
        raise ValueError(f"rule.count_log2={rule.count_log2}: at most 16")
    return rule


def rule_to_dict(rule: Rule) -> dict:
    return {"group": list(rule.group), "layer": list(rule.layer), "chunk": list(rule.chunk),
            "contributors": rule.contributors, "results": rule.results, "base": rule.base,
            "count_log2": rule.count_log2, "dtype": rule.dtype.name.lower(), "red_op": rule.red_op.name.lower(),
            "acc_fp32": rule.acc_fp32, "saturate": rule.saturate, "reproducible": rule.reproducible}


class Client:
    """HTTP+JSON requests to the service, the token in every one.

    Members
    -------
    base : str
        ``http://HOST:PORT``.
    """

    def __init__(self, address: str, token: str | None, timeout: float = 10.0):
        address = address.removeprefix("http://").removeprefix("tcp:").rstrip("/")
        self.base, self.token, self.timeout = f"http://{address}", token, timeout

    def _check_owner(self) -> None:
        """The token goes only to a service of root or this user (docs/security.md)."""
        from .endpoint import EndpointError, check_listener
        host, _, port = self.base.removeprefix("http://").rpartition(":")
        try:
            if port.isdigit():
                check_listener(host, int(port), "cais-controller at")
        except EndpointError as e:
            raise ServiceError(str(e)) from None

    def request(self, method: str, path: str, body: dict | None = None, raw: bool = False):
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.base + path, data=data, method=method)
        if self.token:
            self._check_owner()
            req.add_header("Authorization", f"Bearer {self.token}")
        if data is not None:
            req.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as resp:
                payload = resp.read()
        except urllib.error.HTTPError as e:
            try:
                message = json.loads(e.read()).get("error", e.reason)
            except ValueError:
                message = e.reason
            raise ServiceError(f"{method} {path}: {e.code} {message}", e.code) from None
        except (urllib.error.URLError, OSError) as e:
            why = getattr(e, "reason", e)
            raise ServiceError(f"cais-controller at {self.base} cannot be reached ({why})") from None
        return payload.decode() if raw else json.loads(payload)


# ---------------------------------------------------------------------- printing
def _fmt_s(v) -> str:
    if v is None:
        return "-"
    return f"{v * 1e6:.0f} us" if v < 1e-3 else f"{v * 1e3:.2f} ms" if v < 1 else f"{v:.2f} s"


def _ports(mask: int) -> str:
    return ",".join(str(p) for p in range(16) if mask >> p & 1) or "-"


def rules_table(rules: list[dict]) -> str:
    lines = [f"{'idx':>3} {'owner':<9} {'group':<9} {'layer':<11} {'chunk':<11} {'contrib':<12} {'results':<12} "
             f"{'slots':<9} kind", "-" * 96]
    for x in rules:
        r = x["rule"]
        flags = "".join(f" {f}" for f in ("acc_fp32", "saturate", "reproducible") if r[f])
        lines.append(f"{x['index']:>3} {x['owner']:<9} {r['group'][0]}/{r['group'][1]:#x}".ljust(24)
                     + f" {r['layer'][0]}/{r['layer'][1]:#x}".ljust(12) + f" {r['chunk'][0]}/{r['chunk'][1]:#x}".ljust(12)
                     + f" {_ports(r['contributors']):<12} {_ports(r['results']):<12} "
                     + f"{r['base']}+{1 << r['count_log2']}".ljust(9) + f" {r['dtype']} {r['red_op']}{flags}")
    if not rules:
        lines.append("(no rules)")
    return "\n".join(lines)


def groups_table(groups: list[dict]) -> str:
    lines = [f"{'group':>5} {'ranks':<12} {'rule':>4} {'slots':<9} {'sets used':>9} {'kind':<22} {'coll':>5} "
             f"{'offl':>5} {'fb':>4} {'completions':>11} {'contribs':>9} {'bytes':>10} {'aged':>5} dropped", "-" * 132]
    for g in groups:
        slots = f"{g['base']}+{g['slots']}" if g["base"] is not None else "host only"
        used = f"{g['sets_in_use']}/{g['sets_allocated']}"
        dropped = ",".join(g["dropped"]) or "-"
        lines.append(f"{g['group_id']:>5} {','.join(map(str, g['ranks'])):<12} "
                     f"{'-' if g['rule_index'] is None else g['rule_index']:>4} {slots:<9} {used:>9} {g['kind']:<22} "
                     f"{g['collectives']:>5} {g['offloaded']:>5} {g['fell_back']:>4} {g['completions']:>11} "
                     f"{g['contributions']:>9} {g['bytes_reduced']:>10} {g['sets_aged']:>5} {dropped}")
    return "\n".join(lines)


def jobs_table(answer: dict) -> str:
    """Running jobs, each group with where it runs (switch, or host ring and why), then the ended jobs."""
    lines = [f"{'job':<16} {'state':<8} {'hosts':<14} {'joined':<10} {'groups (path)'}", "-" * 100]
    for j in answer["jobs"]:
        groups = "; ".join(f"{g['group_id']} {g['path']}" + (f" ({g['why_not']})" if g["why_not"] else "")
                           for g in j["groups"]) or "-"
        lines.append(f"{j['job']:<16} {j['state']:<8} {','.join(map(str, j['hosts'])):<14} "
                     f"{','.join(map(str, j['joined'])) or '-':<10} {groups}")
    if not answer["jobs"]:
        lines.append("(no running job)")
    if answer.get("ended"):
        lines.append("")
        lines.append("ended: " + ", ".join(f"{e['job']} {e['state']}" + (f" (rank(s) {e['dead']} died)" if e["dead"] else "")
                                           for e in answer["ended"][-10:]))
    return "\n".join(lines)


def decisions_table(answer: dict) -> str:
    """The latest decisions, each with what decided it, then the tally by path and reason code."""
    lines = [f"{'job':<12} {'group':>5} {'op':>5} {'bytes':>10} {'ranks':>5} {'path':<6} {'score':>7} {'thresh':>6} "
             f"{'reason code':<24} reason", "-" * 120]
    for d in answer["decisions"]:
        lines.append(f"{d['job'] or '-':<12} {d['group']:>5} {d['op_seq']:>5} {d['nbytes']:>10} {d['ranks']:>5} "
                     f"{d['path']:<6} {d['score']:>7.3f} {d['threshold']:>6.3f} {d['code']:<24} {d['reason']}")
    if not answer["decisions"]:
        lines.append("(no decision yet)")
    lines.append("")
    lines.append(f"{answer['total']} decisions (offload={answer['offload']}, threshold {answer['threshold']:.3f}): "
                 + (", ".join(f"{t['path']} {t['reason']} {t['count']}" for t in answer["tally"]) or "none"))
    return "\n".join(lines)


def stats_text(answer: dict) -> str:
    st = answer["stats"]
    q, lat = st.get("queue_delay_s", {}), st.get("collective_latency_s", {})
    lines = [f"slot sets in use      {st.get('sram_usage', 0):.1%}   allocated {st.get('sram_allocated', 0):.1%}",
             "collectives by path   " + ", ".join(f"{p} {n} ({st.get('bytes_by_path', {}).get(p, 0)} B)"
                                                   for p, n in st.get("collectives_by_path", {}).items()),
             f"collectives           {st.get('collectives', 0)}, offloaded {st.get('offloaded', 0)}, "
             f"fallback ratio {st.get('fallback_ratio', 0):.1%}, threshold {st.get('threshold', 0):.2f}",
             f"queue delay           P50 {_fmt_s(q.get('p50'))}  P99 {_fmt_s(q.get('p99'))}  "
             f"({q.get('count', 0)} samples)",
             f"collective latency    P50 {_fmt_s(lat.get('p50'))}  P99 {_fmt_s(lat.get('p99'))}  "
             f"({lat.get('count', 0)} samples)"]
    drops = {k: v for k, v in st.get("drops", {}).items() if v}
    lines.append("drops                 " + (", ".join(f"{k} {v}" for k, v in drops.items()) or "none"))
    for p, port in enumerate(st.get("ports", [])):
        if port["rx_frames"] or port["tx_frames"]:
            lines.append(f"port {p:<2}               rx {port['rx_frames']} frames {port['rx_bytes']} B, "
                         f"tx {port['tx_frames']} frames {port['tx_bytes']} B")
    for a in st.get("alerts", []):
        lines.append(f"alert {a['name']:<15} {'FIRING' if a['active'] else 'ok'} (threshold {a['threshold']:.0%}, "
                     f"fired {a['fired']}, cleared {a['cleared']})")
    refused = answer.get("refused", {})
    lines.append("refused requests      " + (", ".join(f"{k} {v}" for k, v in sorted(refused.items()) if v) or "none"))
    return "\n".join(lines)


# ---------------------------------------------------------------------- commands
def _port_list(text: str) -> int:
    mask = 0
    for item in text.split(","):
        try:
            p = int(item, 0)
        except ValueError:
            raise cmdline.argparse.ArgumentTypeError(f"{text!r}: a comma-separated list of port numbers") from None
        if not 0 <= p < 16:
            raise cmdline.argparse.ArgumentTypeError(f"port {p}: not in 0..15")
        mask |= 1 << p
    return mask


def _match(text: str) -> list[int]:
    value, sep, mask = text.partition("/")
    try:
        v = int(value, 0)
        m = int(mask, 0) if sep else None
    except ValueError:
        raise cmdline.argparse.ArgumentTypeError(f"{text!r}: VALUE or VALUE/MASK") from None
    if v < 0 or (m is not None and m < 0):
        raise cmdline.argparse.ArgumentTypeError(f"{text!r}: must not be negative")
    return [v, m]


def build_parser():
    p = cmdline.Parser(prog="cais-cli", description="Operate a CAIS controller (cais-controller's HTTP API).")
    p.add_argument("--controller", default=os.environ.get("CAIS_CONTROLLER_HTTP", "127.0.0.1:7720"),
                   metavar="HOST:PORT", help="the service's HTTP address (default $CAIS_CONTROLLER_HTTP or 127.0.0.1:7720)")
    p.add_argument("--token-file", default=None, metavar="PATH", help="the shared secret (default $CAIS_TOKEN)")
    p.add_argument("--json", action="store_true", help="print the service's JSON answer (also after the command)")
    p.add_argument("--timeout", type=cmdline.number(0, 600, include_low=False), default=10.0, metavar="S")
    cmdline.add_version(p)
    sub = p.add_subparsers(dest="command", required=True, parser_class=cmdline.Parser)
    a = sub.add_parser("add-rule", help="program an operator rule")
    a.add_argument("index", type=cmdline.integer(0))
    a.add_argument("--group", type=_match, required=True, metavar="VALUE[/MASK]", help="mask default 0xff")
    a.add_argument("--layer", type=_match, default=[0, 0], metavar="VALUE[/MASK]", help="default any")
    a.add_argument("--chunk", type=_match, default=[0, 0], metavar="VALUE[/MASK]", help="default any")
    a.add_argument("--contributors", type=_port_list, required=True, metavar="P,P,...")
    a.add_argument("--results", type=_port_list, default=None, metavar="P,P,...", help="default the contributors")
    a.add_argument("--base", type=cmdline.integer(0), required=True)
    a.add_argument("--count-log2", type=cmdline.integer(0), default=0)
    a.add_argument("--dtype", choices=[d.name.lower() for d in DType], default="int32")
    a.add_argument("--op", choices=[o.name.lower() for o in ReduceOp], default="sum")
    for flag in ("acc-fp32", "saturate", "reproducible"):
        a.add_argument(f"--{flag}", action="store_true")
    d = sub.add_parser("del-rule", help="remove an operator rule")
    d.add_argument("index", type=cmdline.integer(0))
    sub.add_parser("dump-rules", help="every rule the controller programmed")
    sub.add_parser("show-stats", help="throughput, P50/P99, drops, ports, alerts")
    sub.add_parser("show-groups", help="groups, quotas and per-group counters")
    sub.add_parser("show-jobs", help="jobs: hosts, ranks joined, each group on the switch or the host ring (why)")
    sd = sub.add_parser("show-decisions", help="the latest offload decisions: path, score, threshold, reason")
    sd.add_argument("--last", type=cmdline.integer(0), default=20, metavar="N", help="how many (default 20)")
    w = sub.add_parser("watch", help="show-stats and show-groups, refreshed in place")
    w.add_argument("--interval", type=cmdline.number(0.05, 3600), default=1.0, metavar="S")
    w.add_argument("--count", type=cmdline.integer(1), default=None, metavar="N", help="stop after N views")
    for command in sub.choices.values():     # --json anywhere: `cais-cli watch --json` as `cais-cli --json watch`
        command.add_argument("--json", action="store_true", default=cmdline.argparse.SUPPRESS,
                             help="print the service's JSON answer")
    return p


def _rule_body(args) -> dict:
    group = [args.group[0], 0xFF if args.group[1] is None else args.group[1]]
    layer = [args.layer[0], 0xFFFF if args.layer[1] is None else args.layer[1]]
    chunk = [args.chunk[0], 0xFFFF if args.chunk[1] is None else args.chunk[1]]
    return {"group": group, "layer": layer, "chunk": chunk, "contributors": args.contributors,
            "results": args.contributors if args.results is None else args.results, "base": args.base,
            "count_log2": args.count_log2, "dtype": args.dtype, "red_op": args.op, "acc_fp32": args.acc_fp32,
            "saturate": args.saturate, "reproducible": args.reproducible}


#: The read-only commands: the service path each GETs and how its answer reads as text.
VIEWS = {
    "dump-rules": ("/v1/rules", lambda ans: rules_table(ans["rules"])),
    "show-stats": ("/v1/stats", stats_text),
    "show-groups": ("/v1/groups", lambda ans: groups_table(ans["groups"])),
    "show-jobs": ("/v1/jobs", jobs_table),
    "show-decisions": ("/v1/decisions?last={args.last}", decisions_table),
}


def run(args, client: Client, out=sys.stdout) -> int:
    cmd = args.command
    if cmd == "add-rule":
        body = {"index": args.index, "rule": _rule_body(args)}
        try:
            rule_from_dict(body["rule"])          # refused here first: the same checks as the service's
        except ValueError as e:
            raise ServiceError(f"add-rule: {e}", 400) from None
        ans = client.request("POST", "/v1/rules", body)
        print(json.dumps(ans) if args.json else f"rule {ans['index']} added", file=out)
    elif cmd == "del-rule":
        ans = client.request("DELETE", f"/v1/rules/{args.index}")
        print(json.dumps(ans) if args.json else f"rule {ans['index']} deleted", file=out)
    elif cmd in VIEWS:
        path, render = VIEWS[cmd]
        ans = client.request("GET", path.format(args=args))
        print(json.dumps(ans) if args.json else render(ans), file=out)
    elif cmd == "watch":
        tty = out.isatty() and not args.json
        n = 0
        while args.count is None or n < args.count:
            stats, groups = client.request("GET", "/v1/stats"), client.request("GET", "/v1/groups")
            if args.json:
                print(json.dumps({"stats": stats["stats"], "groups": groups["groups"]}), file=out, flush=True)
            else:
                view = f"cais-controller {client.base}  {time.strftime('%H:%M:%S')}\n\n{stats_text(stats)}\n\n" \
                       f"{groups_table(groups['groups'])}\n"
                # on a terminal: cursor home and clear, so the view refreshes in place
                print(("\x1b[H\x1b[2J" if tty else "") + view, file=out, flush=True)
            n += 1
            if args.count is None or n < args.count:
                time.sleep(args.interval)
    return 0


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    from .endpoint import read_token
    try:
        token = read_token(args.token_file)
    except (OSError, ValueError) as e:
        parser.error(f"--token-file: {e}")
    try:
        return run(args, Client(args.controller, token, timeout=args.timeout))
    except ServiceError as e:
        print(f"cais-cli: error: {e}", file=sys.stderr)
        return 2 if e.status else 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
