"""fedavg-dmon: how much the federated-vs-isolated comparison depends on the model-selection rule.

The app keeps the weights with the best validation-edge modularity (unsupervised).
With many clients and no shared nodes a client holds few edges (Cora, 15
clients: ~180 nodes, ~2 validation edges each; 45 validation edges in the whole
federation), so that score is mostly noise. This script replays the training of
``fedavg-dmon`` with the protocol's own plain functions
(``fedgraphcore.protocols.fedavg_dmon``: same partition, edge split, initial weights,
dropout streams, Adam state and FedAvg as the app, so the trajectory is the app's;
the ``= app`` column checks the replayed validation-selected F1 against the
app's record of the same run), scores every round's weights on every client, and
reports the per-client macro-F1 that each selection rule would pick:

* ``val``: best validation-edge modularity (the app's ``select=val-modularity``;
  federated: validation-edge-weighted mean over clients; isolated: each client its own);
* ``train+val``: the same on all non-test edges (more edges, but the training edges are in-sample);
* ``last``: the weights after the last round (``select=last``);
* ``oracle``: each client's best F1 over the rounds, in both modes (uses labels; an upper bound, not
  a method; the paper's selection is of this kind: each client's best round on validation F1).

    python benchmarks/fedavg_dmon_selection.py                      # default cells (see --cells)
    python benchmarks/fedavg_dmon_selection.py --cells cora:15:0:0,cora:15:0:1

Replays are cached in ``benchmarks/results/fedavg_dmon_selection/``; the differences go to
``benchmarks/results/fedavg_dmon_selection.json``, which ``fedavg_dmon.py`` renders on its page.
"""

from __future__ import annotations

import json
import os
import sys
from functools import partial
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

import numpy as np  # noqa: E402

from fedgraphcore.config import ArgumentParser  # noqa: E402
from harness import list_arg, run_script, strategy_datasets  # noqa: E402
from fedavg_dmon import run_dir  # noqa: E402  (this directory's grid: where the app's records are)

CACHE = HERE / "results" / "fedavg_dmon_selection"
#: The differences per cell and rule, in points; ``fedavg_dmon.py`` renders them on the fedavg-dmon page.
JSON_PATH = HERE / "results" / "fedavg_dmon_selection.json"
RULES = ("val", "train+val", "last", "oracle")
DEFAULT_CELLS = ",".join(
    [f"{d}:{c}:{ov}:0" for d in ("cora", "citeseer") for ov in ("0", "0.5") for c in (2, 5, 10, 15)]
    + ["cora:15:0:1", "cora:15:0:2"])


def replay(dataset: str, clients: int, overlap: float, seed: int, mode: str, rounds: int) -> dict:
    """Per round r (the weights a client starts round r from) and client: macro-F1 and the modularity
    of the hard assignment on the validation and on the train+validation edges. Every other setting
    is the strategy's default (``FedAvgDMoN.params``), as in the grid's runs."""
    import torch

    from fedgraphcore.data.datasets import load_dataset
    from fedgraphcore.data.partition import partition
    from fedgraphcore.metrics import macro_f1
    from fedgraphcore.protocols import fedavg_dmon
    from strategies.fedavg_dmon import P, FedAvgDMoN

    cfg = {p.key[len(P):]: p.default for p in FedAvgDMoN.params}
    torch.set_num_threads(1)
    data = load_dataset(dataset)
    k = int(data.y.max()) + 1
    local = []
    for s in partition(data, "node-random", clients, seed=seed, overlap=overlap):
        train, val, _ = fedavg_dmon.split_adjacency(s.adj, np.asarray(s.node_ids), seed, cfg["val-fraction"],
                                              cfg["test-fraction"])
        local.append((s, fedavg_dmon.make_graph(s.x, train, cfg["sparse-features"]), val, (train + val).tocsr()))
    model = {"hidden": cfg["hidden"], "dropout": cfg["dropout"]}
    weights = fedavg_dmon.init_weights(local[0][1].x.shape[1], k, seed, **model)
    states = [fedavg_dmon.start_state(weights, seed, i, k, **model) for i in range(clients)]
    out = {"f1": [], "val": [], "train+val": [],
           "edges": {"val": [int(v.nnz // 2) for *_, v, _ in local],
                     "train+val": [int(tv.nnz // 2) for *_, tv in local]}}
    for _ in range(rounds):
        start = [weights] * clients if mode == "federated" else [st.weights for st in states]
        labels = [fedavg_dmon.assign(w, g, k, cfg["hidden"]) for w, (_, g, _, _) in zip(start, local)]
        out["f1"].append([macro_f1(s.y, lab) for lab, (s, *_) in zip(labels, local)])
        out["val"].append([fedavg_dmon.validation_score(lab, v)[0] for lab, (_, _, v, _) in zip(labels, local)])
        out["train+val"].append([fedavg_dmon.validation_score(lab, tv)[0] for lab, (*_, tv) in zip(labels, local)])
        for i, (_, g, _, _) in enumerate(local):
            states[i], _ = fedavg_dmon.local_train(
                states[i], g, k, cfg["local-epochs"], lr=cfg["lr"], collapse=cfg["collapse"],
                weights=weights if mode == "federated" else None,
                keep_optimizer=cfg["optimizer-state"] == "keep", **model)
        if mode == "federated":
            weights = fedavg_dmon.fedavg([st.weights for st in states], [len(s.node_ids) for s, *_ in local])
    return out


def selected_f1(run: dict, mode: str, rule: str) -> float:
    """Mean over clients of the F1 at the round ``rule`` selects (federated: one round for all clients,
    except ``oracle``, which picks per client in both modes)."""
    f1 = np.asarray(run["f1"])
    if rule == "last":
        return float(f1[-1].mean())
    score = f1 if rule == "oracle" else np.asarray(run[rule])
    if mode == "federated" and rule != "oracle":  # the server's rule: fedavg_dmon.combine_scores per round
        from fedgraphcore.protocols.fedavg_dmon import combine_scores

        combined = [combine_scores(row, run["edges"][rule]) for row in score]
        return float(f1[int(np.argmax(combined))].mean())
    picked = score.argmax(0)
    return float(np.mean([f1[picked[c], c] for c in range(f1.shape[1])]))


def app_record(dataset, clients, overlap, seed, mode, rounds):
    """Client F1 of the grid's app run of this cell, or None if it has not run."""
    path = run_dir("figures", dataset, mode, clients, overlap, seed, rounds) / "record.json"
    return json.loads(path.read_text())["client"]["f1"] if path.exists() else None


def parse_cell(text: str, datasets: tuple[str, ...]) -> tuple[str, int, float, int]:
    """``kind`` of a ``--cells`` item: (dataset, clients, overlap, seed); anything else is a ValueError."""
    dataset, clients, overlap, seed = text.split(":")
    cell = dataset, int(clients), float(overlap), int(seed)
    if dataset not in datasets or cell[1] < 1 or not 0 <= cell[2] <= 1 or cell[3] < 0:
        raise ValueError(text)
    return cell


def main(argv=None) -> int:
    datasets = strategy_datasets("fedavg-dmon")
    ap = ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cells", default=DEFAULT_CELLS, help="comma-separated dataset:clients:overlap:seed",
                    type=list_arg(partial(parse_cell, datasets=datasets),
                                  valid=f"dataset:clients:overlap:seed, dataset one of {', '.join(datasets)}, "
                                        "clients >= 1, overlap in [0, 1], seed >= 0"))
    ap.add_argument("--rounds", type=int, default=250)
    args = ap.parse_args(argv)
    CACHE.mkdir(parents=True, exist_ok=True)
    rows = []
    for dataset, clients, overlap, seed in args.cells:
        f1 = {}
        for mode in ("federated", "isolated"):
            path = CACHE / f"{dataset}-{mode}-c{clients}-ov{overlap}-s{seed}-r{args.rounds}.json"
            if not path.exists():
                path.write_text(json.dumps(replay(dataset, clients, overlap, seed, mode, args.rounds)))
            run = json.loads(path.read_text())
            f1[mode] = {r: selected_f1(run, mode, r) for r in RULES}
        rec = app_record(dataset, clients, overlap, seed, "federated", args.rounds)
        rows.append({"dataset": dataset, "clients": clients, "overlap": overlap, "seed": seed,
                     "val_edges": sum(run["edges"]["val"]),  # the same partition and split in both modes
                     "fed_minus_iso": {r: round(100 * (f1["federated"][r] - f1["isolated"][r]), 4) for r in RULES},
                     "fed_f1_val": round(100 * f1["federated"]["val"], 1),
                     "app_f1_val": None if rec is None else round(100 * rec, 1),
                     "equals_app": None if rec is None else abs(rec - f1["federated"]["val"]) < 1e-9})
        print(json.dumps(rows[-1]), flush=True)
    JSON_PATH.write_text(json.dumps({"rounds": args.rounds, "rules": list(RULES), "rows": rows}, indent=1) + "\n")
    print(f"wrote {JSON_PATH}; the page: python benchmarks/fedavg_dmon.py --report")
    return 0


if __name__ == "__main__":
    raise SystemExit(run_script(main))
