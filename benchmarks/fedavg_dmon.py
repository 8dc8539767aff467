"""fedavg-dmon: the paper's Figures 1 and 2, the cost target and the DP-FedAvg curve.

Leeney & McConville, "A Framework for Exploring Federated Community Detection"
(2023): macro-F1 of centralised, federated (FedAvg) and isolated DMoN models
vs the number of clients, node partitions without (Fig. 1) and with (Fig. 2)
shared nodes. Every run goes through ``app.run.run_experiment`` (in-process
engine: the same ServerApp/ClientApp code as ``flwr run``).

    python benchmarks/fedavg_dmon.py                       # everything, paper settings (long)
    python benchmarks/fedavg_dmon.py --suites cost         # the timing figures alone (run on an idle machine)
    python benchmarks/fedavg_dmon.py --suites figures &    # the grid; start it twice to use two cores
    python benchmarks/fedavg_dmon.py --suites figures      # (the processes share the job list)
    python benchmarks/fedavg_dmon.py --report              # only the page and plots, from the finished runs

Suites: ``figures`` (F1/NMI vs clients, modes centralised / federated /
isolated), ``cost`` (250 rounds x 5 clients on Cora: time and bytes per
round), ``dp`` (client-level DP-FedAvg: F1 vs epsilon). Every finished run is
kept as ``benchmarks/results/fedavg_dmon_runs/<run>/record.json``; ``figures``
and ``dp`` runs with a record are not run again (an interrupted grid resumes;
``--force`` re-runs), ``cost`` always runs (it is a timing). Several processes
can work through one grid: each claims a run before starting it. All records are
collected into ``benchmarks/results/fedavg_dmon.json``; the page is
``docs/results/fedavg-dmon.md``, plots under ``docs/results/img/``.

Shared nodes (Figure 2): the authors' code (github.com/willleeney/ugfl,
``random_overlapping``) gives every client ``1.5 N/C`` nodes of a random
permutation; ``partition.overlap = 0.5`` gives every client the same number
(``N/C`` owned nodes plus ``0.5 N/C`` copies of other clients' nodes). Figure 1
uses their ``random`` partition, i.e. ``node-random`` without overlap. Every run
sets ``partition.boundary=false``: the paper's clients lose the edges between them
(with the default ``true`` the federated mode trains on the whole graph;
``benchmarks/fedavg_dmon_boundary.py``).

F1 is macro-F1 after Hungarian matching. "client F1" = mean over clients of
each client's F1 on its own nodes (each client finds its own assignment, as in
the paper; the only fair score for isolated models, whose cluster ids differ
between clients); "union F1" = one labelling of all nodes (each node labelled
by its owner) scored on the whole graph.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.append(str(HERE))  # pages; opacus installs a top-level ``benchmarks`` package

from fedgraphcore.config import ArgumentParser  # noqa: E402
from harness import (config_list, fresh_dir, list_arg, run_script,  # noqa: E402
                       strategy_datasets)

import pages  # noqa: E402

RESULTS = HERE / "results"
RUNS = RESULTS / "fedavg_dmon_runs"
JSON_PATH = RESULTS / "fedavg_dmon.json"

#: measured here with fedgraphcore.models.train_dmon (NOTES.md), Cora, k = 7, 1000 epochs, full graph
CENTRAL_CORA = {"f1": 55.8, "nmi": 47.8, "modularity": 0.747}
COST_TARGET_S = 120.0
SUITES = ("figures", "cost", "dp")


def _key(r: dict) -> str:
    return "{suite}|{dataset}|{mode}|c{clients}|ov{overlap}|s{seed}|r{rounds}|eps{eps}".format(**r)


def model_variant() -> str:
    """Where fedgraphcore.models.DMoNModel applies dropout (the shared model changed during this work)."""
    import inspect

    from fedgraphcore.models import DMoNModel

    return "dropout on logits" if "logits" in inspect.getsource(DMoNModel.forward) else "dropout on GCN output"


def run_dir(suite: str, dataset: str, mode: str, clients: int, overlap: float, seed: int, rounds: int,
            eps: float = 0.0, **_) -> Path:
    return RUNS / f"{suite}-{dataset}-{mode}-c{clients}-ov{float(overlap)}-s{seed}-r{rounds}-e{float(eps)}"


def run_one(suite: str, dataset: str, mode: str, clients: int, overlap: float, seed: int, rounds: int,
            eps: float = 0.0, clip: float = 0.0) -> dict:
    from app.run import run_experiment

    # the paper's setting: each client trains on its own subgraph, cut edges lost (partition.boundary=true,
    # the default, trains on the whole graph: benchmarks/fedavg_dmon_boundary.py)
    overrides = {"seed": seed, "num-rounds": rounds, "reference": False, "fedavg-dmon.mode": mode,
                 "partition.overlap": overlap, "partition.boundary": False}
    if suite == "dp":  # under DP no validation score leaves a client: every row keeps the last weights
        overrides["fedavg-dmon.select"] = "last"
    if eps > 0:  # the DP noise drawn from the run's seed (privacy.noise-seed): a row repeats
        overrides.update({"fedavg-dmon.dp-clip": clip, "fedavg-dmon.dp-epsilon": eps, "privacy.noise-seed": seed})
    out = fresh_dir(run_dir(suite, dataset, mode, clients, overlap, seed, rounds, eps))
    t0, c0 = time.perf_counter(), time.process_time()
    res = run_experiment("fedavg-dmon", dataset, clients, overrides, out, engine="inprocess")
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    rec = make_record(res, suite, dataset, mode, clients, overlap, seed, rounds, eps, clip, wall, cpu,
                      os.getloadavg()[0])
    return {**rec, "noise_seed": seed if eps > 0 else None}


def make_record(res: dict, suite: str, dataset: str, mode: str, clients: int, overlap: float, seed: int,
                rounds: int, eps: float, clip: float, wall: float, cpu: float, load: float) -> dict:
    """The figures kept of one run (``res``: what ``run_experiment`` returned / wrote to result.json)."""
    m, t, c = res["metrics"], res["timing"], res["communication"]
    train_rounds = [r for r in t["per_round"] if r["action"] == "dmon_train"]
    return {
        "suite": suite, "dataset": dataset, "mode": mode, "clients": clients, "overlap": overlap, "seed": seed,
        "rounds": rounds, "eps": eps, "clip": clip,
        "union": {k: m.get(k) for k in ("acc", "f1", "nmi", "ari", "modularity", "conductance")},
        "client": {k: m.get(f"client_mean_{k}") for k in ("acc", "f1", "nmi", "modularity_test",
                                                          "conductance_test", "modularity_local")},
        "selected_round": m.get("selected_round"),
        "dp_epsilon": m.get("dp_epsilon"), "dp_noise_multiplier": m.get("dp_noise_multiplier"),
        "model": model_variant(),
        "wall_s": wall, "cpu_s": cpu, "load_1min": load, "total_s": t["total_s"], "protocol_s": t["protocol_s"],
        "train_round_s_mean": sum(r["seconds"] for r in train_rounds) / max(1, len(train_rounds)),
        "train_round_bytes_up": sum(r["bytes_up"] for r in train_rounds) / max(1, len(train_rounds)),
        "train_round_bytes_down": sum(r["bytes_down"] for r in train_rounds) / max(1, len(train_rounds)),
        "bytes_up": c["bytes_up"], "bytes_down": c["bytes_down"], "messages": c["messages"],
        "rejected": len(c["rejected"]),
    }


def claim(directory: Path) -> bool:
    """Take a run for this process (``claim`` file holding our pid, created atomically);
    False if a live process holds it. Lets any number of grid processes share one job list."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "claim"
    for _ in range(2):
        try:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            try:
                pid = int(path.read_text() or 0)
                os.kill(pid, 0)
                return pid == os.getpid()
            except (ValueError, ProcessLookupError):
                path.unlink(missing_ok=True)  # left by a process that died
                continue
        with os.fdopen(fd, "w") as f:
            f.write(str(os.getpid()))
        return True
    return False


def load() -> dict:
    """The collected JSON plus every per-run record on disk (records win)."""
    db = json.loads(JSON_PATH.read_text()) if JSON_PATH.exists() else {"runs": {}}
    for path in sorted(RUNS.glob("*/record.json")):
        rec = json.loads(path.read_text())
        if rec["suite"] in SUITES:
            db["runs"][_key(rec)] = rec
    return db


def save(db: dict) -> None:
    RESULTS.mkdir(parents=True, exist_ok=True)
    db["generated_utc"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    JSON_PATH.write_text(json.dumps(db, indent=1) + "\n")


def _priority(job: dict, args) -> int:
    """Grid order, so that a grid stopped early holds the most informative runs: seed 0 at every
    other client count (and centralised), then the 2-client cells (the paper's on-par claim) and
    centralised for the other seeds, then seed 0 at the remaining counts, then everything else."""
    first = job["seed"] == args.seeds[0]
    if job["mode"] == "centralised":
        return 0 if first else 1
    if first and job["clients"] in args.clients[::2]:
        return 0
    if job["clients"] == min(args.clients):
        return 1
    return 2 if first else 3


def plan(args) -> list[dict]:
    jobs = []
    if "cost" in args.suites:
        jobs.append(dict(suite="cost", dataset="cora", mode="federated", clients=5, overlap=0.0, seed=0,
                         rounds=250))
    if "figures" in args.suites:  # seed-major: an unfinished grid still has whole seeds
        for seed in args.seeds:
            for dataset in args.datasets:
                jobs.append(dict(suite="figures", dataset=dataset, mode="centralised", clients=1, overlap=0.0,
                                 seed=seed, rounds=args.rounds))
                for overlap in args.overlaps:
                    for clients in args.clients:
                        for mode in ("federated", "isolated"):
                            jobs.append(dict(suite="figures", dataset=dataset, mode=mode, clients=clients,
                                             overlap=overlap, seed=seed, rounds=args.rounds))
        jobs.sort(key=lambda job: 0 if job["suite"] == "cost" else _priority(job, args))
    if "dp" in args.suites:
        for seed in args.dp_seeds:
            for eps in args.epsilons:
                jobs.append(dict(suite="dp", dataset="cora", mode="federated", clients=args.dp_clients, overlap=0.0,
                                 seed=seed, rounds=args.dp_rounds, eps=eps, clip=args.dp_clip if eps > 0 else 0.0))
    return jobs


# --------------------------------------------------------------------------- tables


def _mean(xs):
    xs = [x for x in xs if x is not None]
    return sum(xs) / len(xs) if xs else None


def _std(xs):
    """Sample standard deviation over seeds (None for fewer than two values)."""
    xs = [x for x in xs if x is not None]
    if len(xs) < 2:
        return None
    m = sum(xs) / len(xs)
    return (sum((x - m) ** 2 for x in xs) / (len(xs) - 1)) ** 0.5


def _pct(x):
    return "-" if x is None else f"{100 * x:.1f}"


def _pm(xs):
    """``mean ± std`` in percent over seeds."""
    m, s = _mean(xs), _std(xs)
    return _pct(m) if s is None else f"{100 * m:.1f} ± {100 * s:.1f}"


def _signed(x):
    return "-" if x is None else f"{100 * x:+.1f}"


def _stats(runs: list[dict], scope: str, key: str) -> tuple:
    xs = [r[scope][key] for r in runs]
    return _mean(xs), _std(xs)


def _paired(a: list[dict], b: list[dict]) -> float | None:
    """Mean over the seeds run in both ``a`` and ``b`` of (client F1 of a) - (client F1 of b)."""
    fb = {r["seed"]: r["client"]["f1"] for r in b}
    return _mean(r["client"]["f1"] - fb[r["seed"]] for r in a if r["seed"] in fb)


def figures_table(runs: list[dict]) -> tuple[str, dict]:
    lines, series = [], {}
    fig = [r for r in runs if r["suite"] == "figures"]
    for dataset in sorted({r["dataset"] for r in fig}):
        for rounds in sorted({r["rounds"] for r in fig if r["dataset"] == dataset}):
            sel = [r for r in fig if r["dataset"] == dataset and r["rounds"] == rounds]
            cen = [r for r in sel if r["mode"] == "centralised"]
            cf1, cnmi = _stats(cen, "client", "f1"), _stats(cen, "client", "nmi")
            for overlap in sorted({r["overlap"] for r in sel if r["mode"] != "centralised"}):
                models = sorted({r.get("model", "dropout on GCN output") for r in sel})
                lines += [f"## {figure_title(dataset, overlap)}", "", pages.paragraph(
                          f"{rounds} rounds x 5 local epochs, DMoNModel with {' / '.join(models)}; centralised (1 "
                          f"client, whole graph, seeds {sorted(r['seed'] for r in cen)}): F1 "
                          f"{_pm([r['client']['f1'] for r in cen])}, NMI {_pm([r['client']['nmi'] for r in cen])}."), "",
                          "| clients | seeds | federated F1 | isolated F1 | fed - iso | fed - central | "
                          "federated NMI | isolated NMI | federated union F1 | fed selected round | paper's claim |",
                          "|---|---|---|---|---|---|---|---|---|---|---|"]
                s = {k: [] for k in ("clients", "fed_f1", "fed_f1_sd", "iso_f1", "iso_f1_sd", "fed_nmi",
                                     "fed_nmi_sd", "iso_nmi", "iso_nmi_sd")}
                for clients in sorted({r["clients"] for r in sel if r["overlap"] == overlap and r["mode"] != "centralised"}):
                    f = [r for r in sel if r["overlap"] == overlap and r["clients"] == clients and r["mode"] == "federated"]
                    i = [r for r in sel if r["overlap"] == overlap and r["clients"] == clients and r["mode"] == "isolated"]
                    ff, fi = _stats(f, "client", "f1")[0], _stats(i, "client", "f1")[0]
                    fed_iso, fed_cen = _paired(f, i), _paired(f, cen)
                    claim = "fed > iso"
                    if overlap > 0 and clients == 2:
                        claim += ", fed within 3 of central"
                    ok = []
                    if fed_iso is not None:
                        ok.append("yes" if fed_iso > 0 else "NO")
                    if overlap > 0 and clients == 2 and fed_cen is not None:
                        ok.append("yes" if fed_cen >= -0.03 else "NO")
                    seeds = f"{len(f)}/{len(i)}" if len(f) != len(i) else str(len(f))
                    lines.append(
                        f"| {clients} | {seeds} | {_pm([r['client']['f1'] for r in f])} | "
                        f"{_pm([r['client']['f1'] for r in i])} | "
                        f"{_signed(fed_iso)} | {_signed(fed_cen)} | "
                        f"{_pm([r['client']['nmi'] for r in f])} | {_pm([r['client']['nmi'] for r in i])} | "
                        f"{_pct(_mean(r['union']['f1'] for r in f))} | "
                        f"{', '.join(str(r['selected_round']) for r in sorted(f, key=lambda r: r['seed'])) or '-'} | "
                        f"{claim}: {', '.join(ok) or '-'} |")
                    s["clients"].append(clients)
                    for mode, rs in (("fed", f), ("iso", i)):
                        for metric in ("f1", "nmi"):
                            m, sd = _stats(rs, "client", metric)
                            s[f"{mode}_{metric}"].append(m)
                            s[f"{mode}_{metric}_sd"].append(sd)
                name = f"fedavg_dmon_{dataset}_overlap{overlap}_r{rounds}.png"
                lines += ["", pages.figure(pages.image_path(name), f"{dataset}: F1 and NMI against clients"), ""]
                series[(dataset, overlap, rounds)] = {**s, "cen_f1": cf1, "cen_nmi": cnmi}
    return "\n".join(lines), series


def cost_table(runs: list[dict]) -> str:
    cost = [r for r in runs if r["suite"] == "cost"]
    if not cost:
        return ""
    lines = ["| run | end to end wall (s) | CPU time of the run (s) | load avg | target | protocol (s) | "
             "time per round (s) | bytes up / down per round | client F1 | union F1 |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in cost:
        lines.append(
            f"| Cora, {r['clients']} clients, {r['rounds']} rounds, federated | {r['wall_s']:.1f} | "
            f"{r.get('cpu_s', float('nan')):.1f} | {r.get('load_1min', float('nan')):.1f} | < {COST_TARGET_S:.0f} wall "
            f"({'met' if r['wall_s'] < COST_TARGET_S else 'NOT met'}) | {r['protocol_s']:.1f} | "
            f"{r['train_round_s_mean']:.3f} | {r['train_round_bytes_up'] / 1e6:.2f} MB / "
            f"{r['train_round_bytes_down'] / 1e6:.2f} MB | {_pct(r['client']['f1'])} | {_pct(r['union']['f1'])} |")
    return "\n".join(lines)


def dp_table(runs: list[dict]) -> tuple[str, list]:
    """Rows per target epsilon (0 = no DP), means over the seeds run."""
    dp = [r for r in runs if r["suite"] == "dp"]
    if not dp:
        return "", []
    lines = ["| target epsilon (delta 1e-5) | seeds | noise | rounds | epsilon spent | noise multiplier | clip | "
             "client F1 | union F1 | union NMI |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    rows = []
    for eps in sorted({r["eps"] for r in dp}, key=lambda e: (e == 0, e)):
        rs = [r for r in dp if r["eps"] == eps]
        row = {"eps": eps, "f1": _stats(rs, "client", "f1"), "seeds": sorted(r["seed"] for r in rs)}
        rows.append(row)
        spent = "-" if rs[0]["dp_epsilon"] is None else f"{_mean(r['dp_epsilon'] for r in rs):.3g}"
        nm = "-" if rs[0]["dp_noise_multiplier"] is None else f"{rs[0]['dp_noise_multiplier']:.3g}"
        label = "no DP" if eps == 0 else f"{eps:g}"
        lines.append(f"| {label} | {row['seeds']} | {_row_noise(rs)} | {sorted({r['rounds'] for r in rs})} | "
                     f"{spent} | {nm} | "
                     f"{rs[0]['clip'] or '-'} | {_pm([r['client']['f1'] for r in rs])} | "
                     f"{_pm([r['union']['f1'] for r in rs])} | {_pm([r['union']['nmi'] for r in rs])} |")
    return "\n".join(lines), rows


def _row_noise(rs: list[dict]) -> str:
    """A DP row's noise: none, seeded (each run's noise drawn from its seed), fresh (OS entropy), or which seeds are which."""
    if rs[0]["eps"] == 0:
        return "none"
    seeded = sorted(r["seed"] for r in rs if r.get("noise_seed") is not None)
    fresh = sorted(r["seed"] for r in rs if r.get("noise_seed") is None)
    if not fresh:
        return "seeded"
    return f"seeded {seeded}, fresh {fresh}" if seeded else "fresh"


def _noise(runs: list[dict]) -> str:
    """Where the DP rows' noise came from: each run's seed (the rows repeat) or fresh OS entropy."""
    noised = [r for r in runs if r["suite"] == "dp" and r["eps"] > 0]
    seeded = [r.get("noise_seed") is not None for r in noised]
    if noised and all(seeded):
        return "each noised run draws its noise from its seed (`privacy.noise-seed` = seed), so every row repeats."
    if any(seeded):
        return ("the noise column says where each row's noise came from: seeded rows draw each run's noise from "
                "its seed (`privacy.noise-seed` = seed), so they repeat; fresh rows drew it from OS entropy, so a "
                "re-run moves them (`--suites dp --force --epsilons E` measures a row seeded).")
    return ("the noise is fresh at every run (OS entropy), so a re-run moves the rows; `--suites dp --force` "
            "measures them with `privacy.noise-seed` = seed, which repeats.")


def central_check(runs: list[dict]) -> str:
    cen = [r for r in runs if r["suite"] == "figures" and r["mode"] == "centralised" and r["dataset"] == "cora"]
    if not cen:
        return ""
    f1, nmi = _mean(r["union"]["f1"] for r in cen), _mean(r["union"]["nmi"] for r in cen)
    mod = _mean(r["union"]["modularity"] for r in cen)
    return "\n".join([
        f"| centralised DMoN, Cora | reference (train_dmon, 1000 epochs, all edges) | ours (train edges, selected; "
        f"{len(cen)} runs) | diff |",
        "|---|---|---|---|",
        f"| macro-F1 | {CENTRAL_CORA['f1']} | {_pct(f1)} | {f1 * 100 - CENTRAL_CORA['f1']:+.1f} |",
        f"| NMI | {CENTRAL_CORA['nmi']} | {_pct(nmi)} | {nmi * 100 - CENTRAL_CORA['nmi']:+.1f} |",
        f"| modularity (whole graph) | {CENTRAL_CORA['modularity']} | {mod:.3f} | {mod - CENTRAL_CORA['modularity']:+.3f} |",
    ])


def _band(ax, xs, mean, sd, style, label):
    ys = [None if v is None else 100 * v for v in mean]
    ax.plot(xs, ys, style, label=label)
    lo = [100 * (m - s) if m is not None and s is not None else None for m, s in zip(mean, sd)]
    if all(v is not None for v in lo):
        hi = [100 * (m + s) for m, s in zip(mean, sd)]
        ax.fill_between(xs, lo, hi, alpha=0.2)


def plots(series: dict, dp: list) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    for (dataset, overlap, rounds), s in series.items():
        fig, axes = plt.subplots(1, 2, figsize=(10, 4))
        for ax, metric, name in ((axes[0], "f1", "macro-F1"), (axes[1], "nmi", "NMI")):
            _band(ax, s["clients"], s[f"fed_{metric}"], s[f"fed_{metric}_sd"], "o-", "federated")
            _band(ax, s["clients"], s[f"iso_{metric}"], s[f"iso_{metric}_sd"], "s-", "isolated")
            cm, csd = s[f"cen_{metric}"]
            if cm is not None:
                ax.axhline(100 * cm, ls="--", color="k", lw=1, label="centralised")
                if csd is not None:
                    ax.axhspan(100 * (cm - csd), 100 * (cm + csd), color="k", alpha=0.08)
            ax.set_xlabel("number of clients")
            ax.set_ylabel(f"{name} (%), mean over clients")
            ax.set_xticks(s["clients"])
            ax.grid(alpha=0.3)
            ax.legend()
        shared = "distinct nodes (Figure 1)" if overlap == 0 else f"shared nodes, overlap {overlap} (Figure 2)"
        fig.suptitle(f"{dataset}, {shared}, {rounds} rounds; mean ± std over seeds")
        path = pages.image_path(f"fedavg_dmon_{dataset}_overlap{overlap}_r{rounds}.png")
        fig.tight_layout()
        fig.savefig(path, dpi=110)
        plt.close(fig)
    with_dp = [r for r in dp if r["eps"] > 0]
    if with_dp:
        fig, ax = plt.subplots(figsize=(6, 4))
        ax.semilogx([r["eps"] for r in with_dp], [100 * r["f1"][0] for r in with_dp], "o-", label="DP-FedAvg")
        if all(r["f1"][1] is not None for r in with_dp):
            ax.fill_between([r["eps"] for r in with_dp], [100 * (r["f1"][0] - r["f1"][1]) for r in with_dp],
                            [100 * (r["f1"][0] + r["f1"][1]) for r in with_dp], alpha=0.2)
        base = [r for r in dp if r["eps"] == 0]
        if base:
            ax.axhline(100 * base[0]["f1"][0], ls="--", color="k", lw=1, label="no DP")
        ax.set_xlabel("epsilon (delta = 1e-5)")
        ax.set_ylabel("macro-F1 (%), mean over clients")
        ax.set_title(f"Cora, client-level DP-FedAvg, seeds {with_dp[0]['seeds']}")
        ax.grid(alpha=0.3)
        ax.legend()
        path = pages.image_path("fedavg_dmon_dp.png")
        fig.tight_layout()
        fig.savefig(path, dpi=110)
        plt.close(fig)


def ran(runs: list[dict]) -> str:
    """What the records hold, per suite (so the text never claims more than ran)."""
    out = []
    fig = [r for r in runs if r["suite"] == "figures"]
    for dataset in sorted({r["dataset"] for r in fig}):
        rs = [r for r in fig if r["dataset"] == dataset]
        per_seed = {s: len([r for r in rs if r["seed"] == s]) for s in sorted({r["seed"] for r in rs})}
        out.append(f"{dataset}: {len(rs)} runs, {sorted({r['rounds'] for r in rs})} rounds, clients "
                   f"{sorted({r['clients'] for r in rs if r['mode'] != 'centralised'})}, overlaps "
                   f"{sorted({r['overlap'] for r in rs})}, runs per seed {per_seed}")
    dp = [r for r in runs if r["suite"] == "dp"]
    if dp:
        out.append(f"DP: {len(dp)} runs (Cora, {dp[0]['clients']} clients, {sorted({r['rounds'] for r in dp})} rounds, "
                   f"seeds {sorted({r['seed'] for r in dp})})")
    return "; ".join(out)


SLUG = "fedavg-dmon"
REGENERATE = "python benchmarks/fedavg_dmon.py --report"
SELECTION_JSON = RESULTS / "fedavg_dmon_selection.json"


def figure_title(dataset: str, overlap: float) -> str:
    """The heading of one figure's table (its anchor is the scoreboard's link)."""
    return f"{dataset}, " + ("Figure 1: distinct nodes" if overlap == 0 else f"Figure 2: shared nodes, overlap {overlap:g}")


def selection_table(sel: dict) -> list[str]:
    """federated - isolated per rule and seed (``fedavg_dmon_selection.py``)."""
    rules = sel["rules"]
    lines = ["## Selection rule and single seeds", "", pages.paragraph(
        f"`python benchmarks/fedavg_dmon_selection.py` replays the app's training ({sel['rounds']} rounds) with the "
        "protocol's plain functions and scores every round. Columns: federated - isolated client F1 in points, "
        "one seed per row, under each rule: `val` the app's validation-edge modularity, `train+val` the same on "
        "all non-test edges, `last` the final weights, `oracle` each client's best-F1 round (labels; a bound). "
        "`= app`: the replayed `val` F1 equals the app's record of the same run."), "",
        "| dataset | clients | overlap | seed | val edges | " + " | ".join(f"fed - iso ({r})" for r in rules)
        + " | fed F1 (val) | = app |", "|---|---|---|---|---|" + "---|" * len(rules) + "---|---|"]
    for r in sel["rows"]:
        check = {True: "yes", False: f"NO ({r['app_f1_val']})", None: "-"}[r["equals_app"]]
        lines.append(f"| {r['dataset']} | {r['clients']} | {r['overlap']:g} | {r['seed']} | {r['val_edges']} | "
                     + " | ".join(f"{r['fed_minus_iso'][rule]:+.1f}" for rule in rules)
                     + f" | {r['fed_f1_val']:.1f} | {check} |")
    lines.append("| **cells with fed > iso** | | | | | " + " | ".join(
        f"{sum(r['fed_minus_iso'][rule] > 0 for r in sel['rows'])} of {len(sel['rows'])}" for rule in rules) + " | | |")
    distinct = [d for r in sel["rows"] if r["overlap"] == 0 for d in r["fed_minus_iso"].values()]
    shared = [d for r in sel["rows"] if r["overlap"] > 0 for d in r["fed_minus_iso"].values()]
    spread = (f"Without shared nodes single-seed differences range from {min(distinct):+.1f} to {max(distinct):+.1f} "
              f"points; with shared nodes from {min(shared):+.1f} to {max(shared):+.1f}. " if distinct and shared else "")
    return lines + ["", pages.paragraph(spread + "The paper's claim is judged on the mean over seeds.")]


def render(db: dict) -> str:
    """The fedavg-dmon page's body from the collected records (and the selection replays)."""
    runs = list(db["runs"].values())
    fig_md, series = figures_table(runs)
    dp_md, dp = dp_table(runs)
    plots(series, dp)
    parts = [pages.paragraph(
        "Leeney & McConville 2023. Its Figures 1 and 2 print no numbers, so the targets are its claims: "
        "federated above isolated at every client count, and with shared nodes 2 federated clients within 3 F1 "
        "points of centralised. F1 = macro-F1 after Hungarian matching, mean over clients of each client's "
        "score on its own nodes; union F1 = one labelling of all nodes on the whole graph. Partitions as the "
        "authors' code: Figure 1 `node-random`, Figure 2 `partition.overlap=0.5` (1.5 N/C nodes per client). "
        "Edge split 0.7/0.1/0.2, the GCN sees training edges only; each client keeps the round with the best "
        "validation-edge modularity (unsupervised; the paper selects on validation F1, with labels). Mean ± std "
        "over seeds; `fed - iso` and `fed - central` are means over the seeds both sides ran."), "",
        pages.paragraph(f"Records: {ran(runs) or 'none'}."), ""]
    parts += [fig_md] if fig_md else []
    cc = central_check(runs)
    parts += ["## Centralised DMoN on Cora", "", cc, ""] if cc else []
    ct = cost_table(runs)
    parts += ["## Cost", "", f"Target: 250 rounds x 5 clients on Cora in < {COST_TARGET_S:.0f} s end to end.", "",
              ct, ""] if ct else []
    if dp_md:
        parts += ["## DP-FedAvg", "", pages.paragraph(
            "Client-level: clip and Gaussian noise, epsilon from the Opacus RDP accountant (replace adjacency). "
            "Under DP a client sends only its noised weights, so every row, no DP included, keeps the last "
            "weights (`fedavg-dmon.select = last`). Mean ± std over the seeds listed; " + _noise(runs)), "", dp_md, "",
            pages.figure(pages.image_path("fedavg_dmon_dp.png"), "F1 against epsilon"), ""]
    if SELECTION_JSON.exists():
        parts += selection_table(json.loads(SELECTION_JSON.read_text()))
    return "\n".join(parts)


def score_rows(runs: list[dict]) -> list[pages.ScoreRow]:
    """The paper's claims per dataset and figure, and the cost target."""
    rows = []
    fig = [r for r in runs if r["suite"] == "figures"]
    for dataset in sorted({r["dataset"] for r in fig}):
        cen = [r for r in fig if r["dataset"] == dataset and r["mode"] == "centralised"]
        for overlap in sorted({r["overlap"] for r in fig if r["dataset"] == dataset and r["mode"] != "centralised"}):
            cells = {c: [[r for r in fig if (r["dataset"], r["overlap"], r["clients"], r["mode"]) == (dataset, overlap, c, m)]
                         for m in ("federated", "isolated")]
                     for c in sorted({r["clients"] for r in fig if r["dataset"] == dataset and r["overlap"] == overlap
                                      and r["mode"] != "centralised"})}
            above = sum((_paired(f, i) or 0) > 0 for f, i in cells.values())
            fed = [r for f, _ in cells.values() for r in f]
            common = dict(method="fedavg-dmon", dataset=f"{dataset}, overlap {overlap:g}", paper="-",
                          reference=f"{_pct(_mean(r['client']['f1'] for r in cen))} (centralised F1)",
                          time=f"{_mean(r['protocol_s'] for r in fed):.0f} s",
                          traffic=f"{_mean(r['bytes_up'] for r in fed) / 1e6:.0f} MB up", epsilon="-", page=SLUG,
                          anchor=pages.anchor(figure_title(dataset, overlap)))
            rows.append(pages.ScoreRow(
                **common, metric="client F1: federated > isolated", ours=f"{above} of {len(cells)} client counts",
                verdict="met" if above == len(cells) else "not met", why="the paper's claim, mean over seeds"))
            if overlap > 0 and 2 in cells:
                gap = _paired(cells[2][0], cen)
                rows.append(pages.ScoreRow(
                    **common, metric="client F1, 2 clients: federated - centralised", ours=_signed(gap),
                    verdict="met" if gap is not None and gap >= -0.03 else "not met",
                    why="the paper's claim: within 3 F1 points of centralised"))
    for r in (r for r in runs if r["suite"] == "cost"):
        rows.append(pages.ScoreRow(
            method="fedavg-dmon", dataset=f"cora, {r['clients']} clients", metric="end-to-end wall s, "
            f"{r['rounds']} rounds", paper="-", ours=f"{r['wall_s']:.1f}", reference="-", time=f"{r['wall_s']:.1f} s",
            traffic=f"{r['bytes_up'] / 1e6:.0f} MB up", epsilon="-",
            verdict="met" if r["wall_s"] < COST_TARGET_S else "not met", why=f"target < {COST_TARGET_S:.0f} s",
            page=SLUG, anchor=pages.anchor("Cost")))
    return rows


def write_report(db: dict) -> Path:
    """Re-render ``docs/results/fedavg-dmon.md``, its plots and scoreboard rows from the records."""
    pages.write_scoreboard_rows("fedavg-dmon", score_rows(list(db["runs"].values())))
    return pages.write_page(SLUG, "fedavg-dmon: federated community detection, FedAvg + DMoN", render(db),
                            REGENERATE)


def main(argv=None) -> int:
    ap = ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--suites", default="figures,cost,dp", type=list_arg(choices=SUITES),
                    help=f"comma-separated, from {', '.join(SUITES)}")
    ap.add_argument("--datasets", default="cora,citeseer", type=list_arg(choices=strategy_datasets("fedavg-dmon")))
    ap.add_argument("--clients", default="2,3,5,8,10,15", type=list_arg(int, low=1))
    ap.add_argument("--overlaps", default="0,0.5", type=config_list("partition.overlap"),
                    help="partition.overlap values (0 = Figure 1; 0.5 = the authors' 1.5 N/C nodes per client)")
    ap.add_argument("--seeds", default="0,1,2", type=config_list("seed"))
    ap.add_argument("--rounds", type=int, default=250)
    ap.add_argument("--dp-rounds", type=int, default=100)
    ap.add_argument("--dp-clients", type=int, default=5)
    ap.add_argument("--dp-clip", type=float, default=0.5)
    ap.add_argument("--dp-seeds", default="0,1,2", type=config_list("seed"),
                    help="seeds of the DP rows; each also seeds the run's DP noise (privacy.noise-seed)")
    ap.add_argument("--epsilons", default="0,1,10,100,1000,10000", type=config_list("fedavg-dmon.dp-epsilon"),
                    help="fedavg-dmon.dp-epsilon values (0 = no DP)")
    ap.add_argument("--force", action="store_true", help="re-run figures/dp runs that already have a record")
    ap.add_argument("--report", action="store_true",
                    help="only re-render docs/results/fedavg-dmon.md and its plots from the records (no runs)")
    args = ap.parse_args(argv)
    if not args.report:
        jobs = plan(args)
        for i, job in enumerate(jobs, 1):
            record = run_dir(**job) / "record.json"
            if job["suite"] != "cost" and record.exists() and not args.force:
                continue
            if job["suite"] != "cost" and not claim(run_dir(**job)):
                continue  # another grid process is running it
            rec = run_one(**job)
            record.write_text(json.dumps(rec, indent=1) + "\n")
            print(f"[{i}/{len(jobs)}] {job['suite']:<8}{job['dataset']:<9}{job['mode']:<12}c={job['clients']:<3}"
                  f"ov={job['overlap']:<4}seed={job['seed']} eps={job.get('eps', 0):<7g} client F1 "
                  f"{_pct(rec['client']['f1']):>5} NMI {_pct(rec['client']['nmi']):>5} union F1 "
                  f"{_pct(rec['union']['f1']):>5}  {rec['wall_s']:.1f} s", flush=True)
            if job["suite"] == "cost":
                print(f"cost: {rec['wall_s']:.1f} s end to end (target < {COST_TARGET_S:.0f} s), "
                      f"{rec['train_round_s_mean']:.3f} s and {rec['train_round_bytes_up'] / 1e6:.2f} MB up / "
                      f"{rec['train_round_bytes_down'] / 1e6:.2f} MB down per round, load {rec['load_1min']:.1f}",
                      flush=True)
    db = load()
    if not args.report:
        save(db)
    print(write_report(db))
    return 0


if __name__ == "__main__":
    raise SystemExit(run_script(main))
