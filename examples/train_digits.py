"""Train a small classifier on scikit-learn's bundled digits with DDP, through cais-switch (make train).

One command (root: it makes network namespaces), ``make train`` or::

    python examples/train_digits.py [--ranks 4] [--epochs 8] [--backend model|verilator] [--json]

builds a switch namespace with cais-switch (the reference model, or ``--backend verilator`` the RTL)
and a host namespace with one veth per rank, then runs ``torchrun --nproc-per-node RANKS`` of this file
five times: the "cais" backend twice (the float path; bit-identical runs, the switch folding in port
order: ``reproducible = true``), the "cais" backend with the block floating point hook, and torch's gloo
backend with and without that hook. It prints the loss per epoch, the final accuracy, the path each
gradient bucket took, the bytes each rank sent, the comparisons (docs/torch.md, "The worked example"),
and writes the loss curves to ``build/train/loss.png``.

Each rank process, as torchrun starts it, is just a DDP training script::

    CAIS_IFACE='<tag>h{local_rank}' CAIS_SWITCH=... CAIS_CONTROLLER=... \\
        torchrun --nproc-per-node 4 examples/train_digits.py --worker --backend-kind cais
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import numpy as np

HIDDEN, CLASSES, FEATURES = 64, 10, 64
TRAIN = 1500                # of the 1797 digits; the rest is the test set
BATCH = 16                  # per rank and step
LR = 0.1
FLOAT_TOLERANCE = 1e-4      # cais vs gloo, float path: the largest parameter difference allowed


# ---------------------------------------------------------------------- the training (every rank)
def load_data():
    """The digits (8x8 images, 0..16 scaled to 0..1), shuffled once with a fixed seed: train and test."""
    from sklearn.datasets import load_digits
    x, y = load_digits(return_X_y=True)
    order = np.random.default_rng(0).permutation(len(y))
    x, y = (x[order] / 16.0).astype(np.float32), y[order].astype(np.int64)
    return (x[:TRAIN], y[:TRAIN]), (x[TRAIN:], y[TRAIN:])


def make_model():
    import torch
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(FEATURES, HIDDEN), torch.nn.ReLU(), torch.nn.Linear(HIDDEN, CLASSES))


def batches(rank: int, ranks: int, epoch: int, n: int):
    """This rank's batches of an epoch: an epoch-seeded permutation, rank r taking every ranks-th sample."""
    order = np.random.default_rng(100 + epoch).permutation(n)[rank::ranks]
    steps = len(order) // BATCH
    return [order[s * BATCH:(s + 1) * BATCH] for s in range(steps)]


def interface_bytes(iface: str) -> int:
    try:
        return int(Path(f"/sys/class/net/{iface}/statistics/tx_bytes").read_text())
    except (OSError, ValueError):
        return 0


def worker(args) -> None:
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel
    if args.backend_kind == "cais":
        import cais.torch as ct
    from cais.dist import interface_for
    from cais.torch import hooks
    torch.set_num_threads(1)
    dist.init_process_group(args.backend_kind)          # env://, as torchrun sets it
    rank, ranks = dist.get_rank(), dist.get_world_size()
    (xtr, ytr), (xte, yte) = load_data()
    model = make_model()
    ddp = DistributedDataParallel(model)
    if args.hook == "blockfp":
        ddp.register_comm_hook(hooks.BlockFPState(), hooks.block_fp_hook)
    opt = torch.optim.SGD(ddp.parameters(), lr=LR)
    iface = interface_for(os.environ.get("CAIS_IFACE", "lo"), rank)
    counted = iface if args.backend_kind == "cais" else "lo"
    sent0 = interface_bytes(counted)
    losses, step_s = [], []
    for epoch in range(args.epochs):
        total = torch.zeros(2)
        for idx in batches(rank, ranks, epoch, len(ytr)):
            t0 = time.perf_counter()
            opt.zero_grad()
            loss = torch.nn.functional.cross_entropy(ddp(torch.from_numpy(xtr[idx])), torch.from_numpy(ytr[idx]))
            loss.backward()
            opt.step()
            step_s.append(time.perf_counter() - t0)
            total += torch.tensor([loss.item() * len(idx), len(idx)])
        dist.all_reduce(total)                           # the epoch's mean loss over every rank's samples
        losses.append(float(total[0] / total[1]))
        if rank == 0:
            print(f"[{args.tag}] epoch {epoch}: loss {losses[-1]:.4f}", flush=True)
    sent = interface_bytes(counted) - sent0
    if args.backend_kind != "cais":
        sent //= ranks                                   # the ranks share the loopback: its bytes per rank
    with torch.no_grad():
        accuracy = float((model(torch.from_numpy(xte)).argmax(1).numpy() == yte).mean())
    params = np.concatenate([p.detach().numpy().reshape(-1) for p in model.parameters()])
    bucket_bytes = params.nbytes
    report = {"rank": rank, "ranks": ranks, "losses": losses, "accuracy": accuracy, "params": params.tobytes().hex(),
              "step_s": float(np.median(step_s)), "sent_bytes": sent, "iface": iface, "steps": len(step_s)}
    if args.backend_kind == "cais":
        history = ct.backend_of().history
        # the gradient buckets: the float path's all-reduces of the whole model, the hook's int32 ones
        buckets = [h for h in history if h["bytes"] == bucket_bytes]
        report["bucket_paths"] = dict(Counter(h["path"] for h in buckets))
        report["all_paths"] = ct.backend_of().path_counts()
    Path(args.out, f"{args.tag}-rank{rank}.json").write_text(json.dumps(report))
    dist.destroy_process_group()


# ---------------------------------------------------------------------- the numpy reference of the hook
def block_fp_reference_training(ranks: int, epochs: int) -> np.ndarray:
    """The block floating point run without any communication: each rank's local gradient computed
    here, their mean by :func:`cais.torch.hooks.block_fp_reference` per parameter (numpy: the same
    quantized sums), the same SGD step; the final parameters."""
    import torch
    from cais.torch import hooks
    torch.set_num_threads(1)
    (xtr, ytr), _ = load_data()
    model = make_model()
    params = list(model.parameters())
    opt = torch.optim.SGD(params, lr=LR)
    for epoch in range(epochs):
        plans = [batches(r, ranks, epoch, len(ytr)) for r in range(ranks)]
        for step in range(len(plans[0])):
            grads = []
            for r in range(ranks):
                model.zero_grad()
                idx = plans[r][step]
                torch.nn.functional.cross_entropy(model(torch.from_numpy(xtr[idx])),
                                                  torch.from_numpy(ytr[idx])).backward()
                grads.append([p.grad.numpy().reshape(-1).copy() for p in params])
            for k, p in enumerate(params):        # the hook's blocks are cut per parameter
                mean = hooks.block_fp_reference([g[k] for g in grads])
                p.grad.copy_(torch.from_numpy(mean.reshape(p.shape)))
            opt.step()
    return np.concatenate([p.detach().numpy().reshape(-1) for p in params])


# ---------------------------------------------------------------------- the launcher
RUNS = {  # tag: (backend, hook)
    "cais": ("cais", "float"), "cais-again": ("cais", "float"), "cais-blockfp": ("cais", "blockfp"),
    "gloo": ("gloo", "float"), "gloo-blockfp": ("gloo", "blockfp"),
}


def run_jobs(ranks: int, epochs: int, backend: str, tags, log=print, offload: str = "always") -> dict:
    """Make the namespaces, start cais-switch, run torchrun for each of `tags` (:data:`RUNS`); returns
    {tag: [each rank's report]}."""
    if os.geteuid() != 0:
        raise SystemExit("train_digits: needs root (it creates network namespaces and veth pairs)")
    from cais.cluster import Cluster
    tmp = Path(tempfile.mkdtemp(prefix="cais-train-"))
    cluster = Cluster(ranks, tmp, one_host=True)
    results = {}
    try:
        cluster.create()
        log(f"namespaces: {cluster.switch_ns} (cais-switch, --backend {backend}), {cluster.rank_ns[0]} "
            f"({ranks} ranks, interfaces {cluster.tag}h0..h{ranks - 1})")
        cluster.start_switch([], wait_s=600.0, backend=backend)
        config = tmp / "cais.toml"
        config.write_text(f'[cais]\nreproducible = true\noffload = "{offload}"\n')
        for k, tag in enumerate(tags):
            kind, hook = RUNS[tag]
            env = dict(os.environ, CAIS_IFACE=f"{cluster.tag}h{{local_rank}}", CAIS_SWITCH=cluster.control,
                       CAIS_CONTROLLER=str(tmp / f"coordinator{k}.sock"), CAIS_CONFIG=str(config),
                       CAIS_TIMEOUT="60", OMP_NUM_THREADS="1")
            cmd = ["ip", "netns", "exec", cluster.rank_ns[0], sys.executable, "-m", "torch.distributed.run",
                   "--nproc-per-node", str(ranks), "--master-addr", "127.0.0.1", "--master-port", str(29500 + k),
                   os.path.abspath(__file__), "--worker", "--backend-kind", kind, "--hook", hook,
                   "--epochs", str(epochs), "--tag", tag, "--out", str(tmp)]
            t0 = time.monotonic()
            done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1800)
            if done.returncode:
                raise SystemExit(f"train_digits: the {tag} run failed (exit {done.returncode}):\n"
                                 f"{done.stderr[-3000:]}")
            log(f"{tag}: {time.monotonic() - t0:.1f} s")
            results[tag] = [json.loads((tmp / f"{tag}-rank{r}.json").read_text()) for r in range(ranks)]
    finally:
        cluster.close()
    return results


def params_of(report: dict) -> np.ndarray:
    return np.frombuffer(bytes.fromhex(report["params"]), np.float32)


def compare(results: dict, ranks: int, epochs: int) -> dict:
    """The example's checks (docs/torch.md): each a figure and whether it holds."""
    out = {}
    if "cais" in results and "gloo" in results:
        diff = float(np.max(np.abs(params_of(results["cais"][0]) - params_of(results["gloo"][0]))))
        out["float: cais vs gloo, max |dparam|"] = (diff, diff <= FLOAT_TOLERANCE)
    if "cais" in results and "cais-again" in results:
        same = params_of(results["cais"][0]).tobytes() == params_of(results["cais-again"][0]).tobytes()
        out["float: two cais runs bit-identical"] = (same, same)
    for tag in results:
        same = len({r["params"] for r in results[tag]}) == 1
        out[f"{tag}: every rank's parameters identical"] = (same, same)
    if "cais-blockfp" in results:
        ref = block_fp_reference_training(ranks, epochs)
        same = params_of(results["cais-blockfp"][0]).tobytes() == ref.tobytes()
        out["block-FP: cais == numpy reference, bit for bit"] = (same, same)
        if "gloo-blockfp" in results:
            same = results["cais-blockfp"][0]["params"] == results["gloo-blockfp"][0]["params"]
            out["block-FP: cais == gloo, bit for bit"] = (same, same)
    return out


def plot(results: dict, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(6, 4))
    for tag, style in (("cais", "-o"), ("gloo", "--x"), ("cais-blockfp", ":s")):
        if tag in results:
            ax.plot(results[tag][0]["losses"], style, label=tag)
    ax.set_xlabel("epoch")
    ax.set_ylabel("training loss (mean over every rank's samples)")
    ax.set_title(f"digits, DDP on {results[next(iter(results))][0]['ranks']} ranks")
    ax.legend()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)


def summary(results: dict) -> dict:
    """Per run: final loss and accuracy, median step time, bytes each rank sent, bucket paths."""
    rows = {}
    for tag, reports in results.items():
        r0 = reports[0]
        paths = r0.get("bucket_paths")
        switch = paths.get("switch", 0) / max(1, sum(paths.values())) if paths else None
        rows[tag] = {"loss": r0["losses"], "accuracy": r0["accuracy"], "step_ms": 1e3 * float(
            np.median([r["step_s"] for r in reports])), "sent_bytes_per_rank": [r["sent_bytes"] for r in reports],
            "bucket_paths": paths, "switch_fraction": switch}
    return rows


def rank_count(text: str) -> int:
    """An argument type: a number of ranks, one per switch port (2 up to the switch's most ports)."""
    from cais.cmdline import integer
    from cais.params import ParamError, SwitchParams
    n = integer(2)(text)
    try:
        SwitchParams(ports=n)
    except ParamError as e:
        raise argparse.ArgumentTypeError(f"{n}: one switch port per rank, {e}") from None
    return n


def main(argv=None) -> int:
    from cais.cmdline import Parser, integer
    ap = Parser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ranks", type=rank_count, default=4)
    ap.add_argument("--epochs", type=integer(1), default=8)
    ap.add_argument("--backend", choices=("model", "verilator"), default="model", help="cais-switch's backend")
    ap.add_argument("--offload", choices=("always", "auto", "never"), default="always",
                    help="the controller's offload policy (auto: its score; with Python ranks' measured round "
                         "trips it keeps these small buckets on the host ring)")
    ap.add_argument("--runs", default=",".join(RUNS), help="which runs (comma-separated): " + ", ".join(RUNS))
    ap.add_argument("--plot", default="build/train/loss.png")
    ap.add_argument("--json", action="store_true", help="print the results as JSON")
    # the rank side (torchrun runs this file with --worker)
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--backend-kind", default="cais", help=argparse.SUPPRESS)
    ap.add_argument("--hook", default="float", help=argparse.SUPPRESS)
    ap.add_argument("--tag", default="run", help=argparse.SUPPRESS)
    ap.add_argument("--out", default=".", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        worker(args)
        return 0
    tags = [t for t in args.runs.split(",") if t]
    unknown = [t for t in tags if t not in RUNS]
    if unknown or not tags:
        ap.error(f"--runs: {','.join(unknown) or 'none'}: choose from {', '.join(RUNS)}")
    try:                                 # the plot's folder before minutes of training, not after
        Path(args.plot).parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        ap.error(f"--plot {args.plot}: {e.strerror}")
    log = (lambda *a: print(*a, file=sys.stderr)) if args.json else print
    try:
        results = run_jobs(args.ranks, args.epochs, args.backend, tags, log, args.offload)
    except RuntimeError as e:            # cais-switch did not start: the reason is its log's tail
        raise SystemExit(f"train_digits: {e}") from None
    checks = compare(results, args.ranks, args.epochs)
    rows = summary(results)
    plot(results, Path(args.plot))
    if args.json:
        print(json.dumps({"runs": rows, "checks": {k: {"value": v, "ok": ok} for k, (v, ok) in checks.items()},
                          "plot": args.plot}, default=float))
    else:
        sent = {tag: ", ".join(str(b) for b in row["sent_bytes_per_rank"]) for tag, row in rows.items()}
        width = max(len("bytes sent per rank"), *map(len, sent.values())) + 2
        print(f"\n{'run':<14}{'final loss':>11}{'accuracy':>10}{'step ms':>9}  {'bytes sent per rank':<{width}}buckets")
        for tag, row in rows.items():
            print(f"{tag:<14}{row['loss'][-1]:>11.4f}{row['accuracy']:>10.3f}{row['step_ms']:>9.2f}  "
                  f"{sent[tag]:<{width}}{row['bucket_paths'] or '(gloo: loopback bytes / ranks)'}")
        print("\nloss per epoch:")
        for tag, row in rows.items():
            print(f"  {tag:<14}" + " ".join(f"{v:.4f}" for v in row["loss"]))
        print("\nchecks:")
        for name, (value, ok) in checks.items():
            print(f"  {'OK  ' if ok else 'FAIL'} {name}: {value}")
        print(f"\nloss curves: {args.plot}")
    return 0 if all(ok for _, ok in checks.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
