"""fedavg-dmon on node splits with boundary edges vs the paper's federated mode vs centralised DMoN.

Three settings per dataset, every run through ``app.run.run_experiment`` (in-process engine,
the run-config defaults otherwise):

* ``centralised``: ``fedavg-dmon.mode=centralised``, one client (with the strategy's reference,
  ``fedgraphcore.models.train_dmon`` on the pooled training edges, last weights);
* ``paper``: ``mode=federated`` with ``partition.boundary=false``, the paper's federated mode
  (each client trains on its own subgraph; cut edges lost);
* ``boundary``: ``mode=federated`` with ``partition.boundary=true`` (the default) and
  ``fedavg-dmon.aggregate=weights``: the whole graph's GCN layer and DMoN loss
  (``fedgraphcore.protocols.fedavg_dmon.boundary``), local Adam epochs, FedAvg of the weights;
* ``gradient``: the same with ``aggregate=gradient`` (the default): the server takes one Adam step
  per epoch on the parties' summed exact gradients (``fedgraphcore.protocols.fedavg_dmon.gradient``).

Usage::

    python benchmarks/fedavg_dmon_boundary.py                 # sbm seeds 7..9, cora seeds 0..2, 3 and 5 clients
    python benchmarks/fedavg_dmon_boundary.py --datasets cora --clients 5 --seeds 0
    python benchmarks/fedavg_dmon_boundary.py --datasets sbm --seeds 0 1 2 --settings gradient boundary

Records go to ``benchmarks/results/fedavg_dmon_boundary.json`` (runs already there are kept);
the table of seed means is printed.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
JSON_PATH = HERE / "results" / "fedavg_dmon_boundary.json"
SETTINGS = {"centralised": {"fedavg-dmon.mode": "centralised"},
            "paper": {"fedavg-dmon.mode": "federated", "partition.boundary": False},
            "boundary": {"fedavg-dmon.mode": "federated", "partition.boundary": True,
                         "fedavg-dmon.aggregate": "weights"},
            "gradient": {"fedavg-dmon.mode": "federated", "partition.boundary": True,
                         "fedavg-dmon.aggregate": "gradient"}}
SEEDS = {"sbm": (7, 8, 9), "cora": (0, 1, 2)}


def run_one(dataset: str, setting: str, clients: int, seed: int, rounds: int | None) -> dict:
    """One run's figures: quality, selected round, protocol rounds, bytes, wall time (``rounds``:
    num-rounds, None: the run-config default)."""
    from app.run import run_experiment

    overrides = {"seed": seed, "reference": setting == "centralised", **SETTINGS[setting],
                 **({"num-rounds": rounds} if rounds else {})}
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as out:
        res = run_experiment("fedavg-dmon", dataset, clients, overrides, Path(out) / "run", engine="inprocess")
    m, comm = res["metrics"], res["communication"]
    rec = {"dataset": dataset, "setting": setting, "clients": clients, "seed": seed,
           **{key: m[key] for key in ("acc", "f1", "nmi", "modularity")},
           "selected_round": m.get("selected_round"), "num_rounds": res["config"]["num-rounds"],
           "message_rounds": res["timing"]["rounds"], "bytes_up": comm["bytes_up"], "bytes_down": comm["bytes_down"],
           "wall_s": time.perf_counter() - t0}
    if setting == "centralised":
        rec["reference"] = {key: res["reference"][key] for key in ("acc", "f1", "nmi", "modularity")}
    return rec


def _key(r: dict) -> str:
    return f"{r['dataset']}|{r['setting']}|c{r['clients']}|s{r['seed']}"


def table(records: list[dict]) -> str:
    """Seed means (ACC, F1 in %), rounds and MB per run, by dataset, setting and clients."""
    import numpy as np

    lines = ["| dataset | setting | clients | seeds | ACC | macro-F1 | NMI | message rounds | MB up | MB down |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    groups: dict = {}
    for r in records:
        groups.setdefault((f"{r['dataset']} ({r['num_rounds']} rounds)", r["setting"], r["clients"]), []).append(r)
    order = {name: i for i, name in enumerate(SETTINGS)}
    for (ds, setting, c), rs in sorted(groups.items(), key=lambda kv: (kv[0][0], order[kv[0][1]], kv[0][2])):
        mean = lambda key: float(np.mean([r[key] for r in rs]))  # noqa: E731
        lines.append(f"| {ds} | {setting} | {c} | {len(rs)} | {100 * mean('acc'):.1f} | {100 * mean('f1'):.1f} | "
                     f"{100 * mean('nmi'):.1f} | {mean('message_rounds'):.0f} | {mean('bytes_up') / 1e6:.1f} | "
                     f"{mean('bytes_down') / 1e6:.1f} |")
        if setting == "centralised":
            ref = lambda key: float(np.mean([r["reference"][key] for r in rs]))  # noqa: E731
            lines.append(f"| {ds} | reference (train_dmon, last weights) | 1 | {len(rs)} | {100 * ref('acc'):.1f} | "
                         f"{100 * ref('f1'):.1f} | {100 * ref('nmi'):.1f} | | | |")
    return "\n".join(lines)


def _save(key: str, record: dict) -> None:
    """Add one record to the JSON file as it is now (another run of this script may have added some)."""
    db = json.loads(JSON_PATH.read_text()) if JSON_PATH.exists() else {}
    db[key] = record
    JSON_PATH.parent.mkdir(parents=True, exist_ok=True)
    JSON_PATH.write_text(json.dumps(db, indent=1, sort_keys=True))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--datasets", nargs="+", default=["sbm", "cora"])
    ap.add_argument("--clients", nargs="+", type=int, default=[3, 5])
    ap.add_argument("--seeds", nargs="+", type=int, default=None, help="default: sbm 7 8 9, cora 0 1 2")
    ap.add_argument("--rounds", type=int, default=None, help="num-rounds (default: the run-config default)")
    ap.add_argument("--settings", nargs="+", default=["paper", "boundary", "gradient"],
                    choices=[s for s in SETTINGS if s != "centralised"], help="federated settings (centralised always)")
    args = ap.parse_args()
    db = json.loads(JSON_PATH.read_text()) if JSON_PATH.exists() else {}
    for ds in args.datasets:
        for seed in args.seeds or SEEDS.get(ds, (0, 1, 2)):
            jobs = [("centralised", 1)] + [(s, c) for c in args.clients for s in args.settings]
            for setting, clients in jobs:
                key = f"{ds}|{setting}|c{clients}|s{seed}" + (f"|r{args.rounds}" if args.rounds else "")
                if key not in db:
                    db[key] = run_one(ds, setting, clients, seed, args.rounds)
                    _save(key, db[key])
                    print(key, {k: db[key][k] for k in ("acc", "f1", "selected_round", "wall_s")}, flush=True)
    print(table(list(json.loads(JSON_PATH.read_text()).values())))


if __name__ == "__main__":
    main()
