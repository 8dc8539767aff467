"""GW-LDP benchmark: paper Table 1 (SVC accuracy on GW kernels), Figure 2/5
(clustering of 1-hop Citeseer subgraphs vs epsilon, mean GW vs epsilon) and
GW-matrix timing.

    python benchmarks/gw_ldp.py [--seeds 3] [--rounds 40] [--parts table1,cluster,timing]

Every federated number comes from ``app.run.run_experiment(..., engine="inprocess")``
(the real ServerApp/ClientApp message flow). The GW_A row is the centralised
topology-only baseline (shortest-path GW, computed on the pooled graphs, SVC on
a seeded 7:2:1 split). Writes ``benchmarks/results/gw_ldp.json``, plots next to
it, and the ``gw_ldp`` section of ``benchmarks/RESULTS.md``.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from app.protocols import gw_ldp as proto  # noqa: E402
from app.bench import replace_section  # noqa: E402
from app.run import run_experiment  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"
JSON_PATH = RESULTS / "gw_ldp.json"
MD_PATH = ROOT / "benchmarks" / "RESULTS.md"
START, END = "<!-- gw_ldp:start -->", "<!-- gw_ldp:end -->"

# Table 1 of the paper (accuracy %, mean, std)
PAPER = {
    ("GW_A", "mutag"): (83.26, 10.3), ("GW_A", "proteins"): (74.55, 2.74), ("GW_A", "imdb-binary"): (63.8, 3.49),
    ("GW_H(GCN)", "mutag"): (80.3, 9.75), ("GW_H(GCN)", "proteins"): (72.31, 4.61),
    ("GW_H(GCN)", "imdb-binary"): (53.69, 4.31),
    ("GW_H*(GCN)", "mutag"): (79.57, 6.73), ("GW_H*(GCN)", "proteins"): (71.19, 3.92),
    ("GW_H*(GCN)", "imdb-binary"): (54.01, 4.90),
    ("GW_H(GIN)", "mutag"): (93.08, 3.35), ("GW_H(GIN)", "proteins"): (75.53, 2.01),
    ("GW_H(GIN)", "imdb-binary"): (74.4, 1.11),
    ("GW_H*(GIN)", "mutag"): (91.17, 4.21), ("GW_H*(GIN)", "proteins"): (76.89, 3.90),
    ("GW_H*(GIN)", "imdb-binary"): (73.6, 3.23),
}


def load_json() -> dict:
    return json.loads(JSON_PATH.read_text()) if JSON_PATH.exists() else {}


def save_json(data: dict) -> None:
    JSON_PATH.parent.mkdir(parents=True, exist_ok=True)
    JSON_PATH.write_text(json.dumps(data, indent=1, default=float))


def fed_run(dataset: str, overrides: dict, clients: int = 10) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        r = run_experiment("gw-ldp", dataset, clients, {"reference": False, **overrides}, tmp, engine="inprocess")
    keep = ("svc_test_acc", "svc_val_acc", "acc", "nmi", "ari", "gw_mean", "gw_s", "train_s", "gw_pairs",
            "gw_solved_pairs", "gw_distinct_spaces", "test_graphs")
    out = {k: r["metrics"].get(k) for k in keep}
    out["epsilon"] = r["privacy"]["epsilon"]
    out["protocol_s"] = r["timing"]["protocol_s"]
    out["bytes_up"] = r["communication"]["bytes_up"]
    return out


def centralised_gw_a(dataset: str, seeds: list[int], workers: int) -> dict:
    from app.data import load_dataset

    data = load_dataset(dataset)
    t0 = time.perf_counter()
    stats: dict = {}
    dist = proto.gw_matrix([proto.shortest_path_matrix(g.adj) for g in data.graphs], workers, stats=stats)
    secs = time.perf_counter() - t0
    accs = []
    for seed in seeds:
        split = proto.split_items(len(data.graphs), seed, 0)
        accs.append(proto.svc_select(dist, data.y, split)["test_acc"])
    return {"accs": accs, "gw_s": secs, **stats}


def part_table1(args, data: dict) -> None:
    seeds = list(range(args.seeds))
    table = data.setdefault("table1", {})
    for dataset in args.datasets:
        print(f"== Table 1: {dataset}", flush=True)
        if args.gw_a and len(table.get(f"GW_A|{dataset}", {}).get("accs", [])) < len(seeds):
            table[f"GW_A|{dataset}"] = centralised_gw_a(dataset, seeds, args.workers)
        save_json(data)
        for model in args.models:
            for star, eps in (("*", 0.0), ("", math.inf)):
                key = f"GW_H{star}({model.upper()})|{dataset}"
                runs = table.setdefault(key, {"runs": []})["runs"]
                for seed in seeds[len(runs):]:
                    t0 = time.perf_counter()
                    r = fed_run(dataset, {"seed": seed, "gw-ldp.model": model, "gw-ldp.epsilon": eps,
                                          "num-rounds": args.rounds, "gw-ldp.local-epochs": args.epochs,
                                          "gw-ldp.workers": args.workers})
                    runs.append(r)
                    print(f"  {key} seed {seed}: svc {r['svc_test_acc']:.3f}  gw {r['gw_s']:.1f}s "
                          f"total {time.perf_counter() - t0:.1f}s", flush=True)
                    save_json(data)
    # epsilon sweep (GIN, MUTAG, seed 0): utility vs the real LDP budget per graph
    sweep = data.setdefault("mutag_eps_sweep", {})
    for eps in args.sweep:
        key = "inf" if math.isinf(eps) else ("1/|V|" if eps == 0 else f"{eps:g}")
        if key in sweep:
            continue
        r = fed_run("mutag", {"seed": 0, "gw-ldp.model": "gin", "gw-ldp.epsilon": eps, "num-rounds": args.rounds,
                              "gw-ldp.local-epochs": args.epochs, "gw-ldp.workers": args.workers})
        sweep[key] = r
        print(f"  MUTAG GIN eps={key}: svc {r['svc_test_acc']:.3f} nmi {r['nmi']:.3f}", flush=True)
        save_json(data)


def part_cluster(args, data: dict) -> None:
    res = data.setdefault("citeseer_1hop", {})
    for eps in (math.inf, 0.0, 0.1, 1.0):
        key = "0 (no LDP)" if math.isinf(eps) else ("1/|V|" if eps == 0 else f"{eps:g}")
        if key in res:
            continue
        r = fed_run("citeseer", {"partitioner": "khop", "khop.hops": 1, "khop.centres": args.centres,
                                 "gw-ldp.model": "gcn", "gw-ldp.epsilon": eps, "num-rounds": args.cluster_rounds,
                                 "gw-ldp.local-epochs": args.epochs, "gw-ldp.workers": args.workers, "seed": 0})
        res[key] = r
        print(f"  Citeseer 1-hop eps={key}: acc {r['acc']:.3f} nmi {r['nmi']:.3f} mean GW {r['gw_mean']:.4f} "
              f"gw {r['gw_s']:.1f}s", flush=True)
        save_json(data)


def part_timing(args, data: dict) -> None:
    """MUTAG GW matrix: shortest paths (GW_A), 1 vs 2 workers; PROTEINS/IMDB-B estimate from a pair sample."""
    from app.data import load_dataset

    t = data.setdefault("timing", {})
    mutag = load_dataset("mutag")
    mats = [proto.shortest_path_matrix(g.adj) for g in mutag.graphs]
    for workers in (1, 2):
        t0 = time.perf_counter()
        stats: dict = {}
        proto.gw_matrix(mats, workers, stats=stats)
        t[f"mutag_sp_workers{workers}_s"] = time.perf_counter() - t0
        t["mutag_sp_stats"] = stats
        print(f"  MUTAG GW_A {stats}: {workers} worker(s) {t[f'mutag_sp_workers{workers}_s']:.1f}s", flush=True)
        save_json(data)
    rng = np.random.default_rng(0)
    for name in ("proteins", "imdb-binary"):
        coll = load_dataset(name)
        n = len(coll.graphs)
        # LDP-coded 2-class embeddings at epsilon = 1/|V| (what the federated run uploads): sample pairs
        spaces = []
        for g in coll.graphs:
            h = rng.dirichlet(np.ones(2), size=g.num_nodes)
            codes, _ = proto.encode_graph(h, 1.0 / g.num_nodes, rng)
            spaces.append(proto.embedding_space(codes))
        sample = [tuple(rng.choice(n, 2, replace=False)) for _ in range(args.sample_pairs)]
        t0 = time.perf_counter()
        for i, j in sample:
            proto.gw_pair(spaces[i][0], spaces[j][0], spaces[i][1], spaces[j][1])
        per = (time.perf_counter() - t0) / len(sample)
        total = n * (n - 1) // 2
        t[f"{name}_ldp_per_pair_ms"] = per * 1e3
        t[f"{name}_ldp_estimated_full_s_2workers"] = per * total / 2
        print(f"  {name}: {per * 1e3:.3f} ms/pair (1 core, LDP codes) -> {total} pairs ~ {per * total / 2:.0f}s "
              "on 2 workers", flush=True)
        save_json(data)


def _ms(values) -> tuple[float, float]:
    v = np.asarray([x for x in values if x is not None], dtype=float) * 100
    return (float(v.mean()), float(v.std())) if v.size else (float("nan"), float("nan"))


def render(data: dict, args) -> str:
    cmds = "; ".join(f"`python benchmarks/gw_ldp.py {c}`" for c in data.get("commands", []))
    lines = [START, "## GW-LDP: Gromov-Wasserstein with LDP embeddings (issue 8)", "",
             f"Runs (results accumulate in the JSON): {cmds}. Federated numbers through "
             "`app.run.run_experiment(engine=\"inprocess\")`, 10 clients (Dirichlet alpha 0.5), each client "
             "splitting its graphs 7:2:1; SVC accuracy on its test graphs, C/gamma picked on validation. "
             "Machine shared with other engineers (load 3-19 on 2 cores while this ran): times vary with the load.", ""]
    t1 = data.get("table1", {})
    if t1:
        lines += ["### Table 1: SVC accuracy (%), mean ± std over seeds", "",
                  "| source | dataset | paper | ours | difference | runs | GW matrix s (median / min) |",
                  "|---|---|---|---|---|---|---|"]
        for key, val in t1.items():
            row, ds = key.split("|")
            accs = val["accs"] if "accs" in val else [r["svc_test_acc"] for r in val["runs"]]
            m, s = _ms(accs)
            p = PAPER.get((row, ds))
            ptxt = f"{p[0]:.2f} ± {p[1]:.2f}" if p else "-"
            diff = f"{m - p[0]:+.2f}" if p else "-"
            label = row + (" (centralised, topology)" if row == "GW_A" else "")
            if "accs" in val:
                gw_txt = f"{val['gw_s']:.1f}"
            else:
                times = [r["gw_s"] for r in val["runs"]]
                gw_txt = f"{np.median(times):.1f} / {min(times):.1f}"
            lines.append(f"| {label} | {ds} | {ptxt} | {m:.2f} ± {s:.2f} | {diff} | {len(accs)} | {gw_txt} |")
        lines.append("")
    sw = data.get("mutag_eps_sweep", {})
    if sw:
        lines += ["### MUTAG, GIN: accuracy vs LDP budget per graph (seed 0)", "",
                  "| epsilon per graph | SVC acc % | clustering NMI % | ledger epsilon |", "|---|---|---|---|"]
        for k, r in sw.items():
            lines.append(f"| {k.replace('|', chr(92) + '|')} | {100 * r['svc_test_acc']:.1f} | {100 * r['nmi']:.1f} | {r['epsilon']} |")
        lines.append("")
    cl = data.get("citeseer_1hop", {})
    if cl:
        lines += [f"### Citeseer, {args.centres} 1-hop subgraphs: clustering vs pseudo-labels (Figure 2), "
                  "mean GW (Figure 5)", "",
                  "Paper: Figure 2 is a t-SNE plot without numbers; Figure 5 reports mean GW 2.38 (no LDP), "
                  "2.42 (1/|V|), 2.43 (0.1), 3.25 (1) on 5 subgraphs (scale depends on their embedding).", "",
                  "| epsilon | ACC % | NMI % | mean GW | GW time s |", "|---|---|---|---|---|"]
        for k, r in cl.items():
            lines.append(f"| {k.replace('|', chr(92) + '|')} | {100 * r['acc']:.1f} | {100 * r['nmi']:.1f} | {r['gw_mean']:.4f} | {r['gw_s']:.1f} |")
        lines.append("")
    tm = data.get("timing", {})
    if tm:
        lines += ["### GW matrix timing", "",
                  f"- MUTAG shortest-path GW (GW_A), {tm.get('mutag_sp_stats', {})}: "
                  f"1 worker {tm.get('mutag_sp_workers1_s', float('nan')):.1f} s, "
                  f"2 workers {tm.get('mutag_sp_workers2_s', float('nan')):.1f} s (target < 10 s; "
                  "NOTES.md: 45 s sequential on a quiet machine). Measured at load ~3 (other engineers' "
                  "jobs), so the second worker had no free core; 24 graphs repeat another graph's shortest-path "
                  "matrix (GW 0, exact), so 13,366 distinct pairs are solved.",
                  "- In-run MUTAG GW matrices (2 workers, all 17,578 pairs, see the last column of Table 1): "
                  "LDP codes (GW_H*) 8.1-8.4 s in the two GCN runs at the lowest load seen (GIN runs: 14.9 s min), "
                  "plain embeddings (GW_H) 11.2-11.6 s; "
                  "distinct embedding rows are merged with their multiplicity as weight (same metric-measure "
                  "space; GW values agree with the unmerged ones within 1e-7 in the tests), so an LDP-coded "
                  "graph has at most 4 points.",
                  ]
        for name in ("proteins", "imdb-binary"):
            if f"{name}_ldp_per_pair_ms" in tm:
                lines.append(f"- {name}, LDP-coded embeddings: {tm[f'{name}_ldp_per_pair_ms']:.3f} ms/pair "
                             f"(sampled) -> full matrix ~{tm[f'{name}_ldp_estimated_full_s_2workers']:.0f} s "
                             "on 2 workers (estimate from sampled pairs).")
        prot = data.get("table1", {}).get("GW_H*(GIN)|proteins", {}).get("runs", [])
        if prot:
            lines.append(f"- PROTEINS, full federated GW_H* matrix (618,828 pairs) measured in the run: "
                         f"{prot[0]['gw_s']:.0f} s on 2 workers (load 6-8).")
        lines.append("")
    lines += ["### Reading these numbers", "",
              "- GW_H* at the paper's default epsilon = 1/|V| per graph: each sampled entry is an "
              "epsilon/(m n)-randomised response, P(+1) within 1/(4 n^2) of 1/2 (0.0008 on MUTAG), so the "
              "codes are close to pure noise and carry little besides the graph size; the SVC then sits near "
              "the majority rate. The paper's 91.17 (MUTAG) is not reachable with the mechanism as specified "
              "(the paper describes larger epsilon as *more* noise, the reverse of Algorithm 1).",
              "- GW compares intra-distance geometries only: it is invariant to any isometry of the "
              "embedding space, so a graph whose nodes all get class 0 and one whose nodes all get class 1 are "
              "at GW 0. With softmax embeddings of C = 2 classes (MUTAG) or homophilous 1-hop subgraphs "
              "(Citeseer) the class identity the GNN learned is largely invisible to GW, which explains the "
              "weak clustering NMI against centre pseudo-labels.",
              "- Few test graphs per run (about 19 on MUTAG with a 7:2:1 split per client) make the "
              "per-seed SVC accuracy noisy (steps of ~5%).", ""]
    lines.append(END)
    return "\n".join(lines)


def write_md(text: str) -> None:
    """Replace this benchmark's section of RESULTS.md (``text`` carries its markers)."""
    replace_section(MD_PATH, "gw_ldp", text.replace(START, "").replace(END, ""))


def plots(data: dict) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cl = data.get("citeseer_1hop", {})
    if cl:
        fig, ax = plt.subplots(1, 2, figsize=(9, 3.5))
        keys = list(cl)
        ax[0].bar(np.arange(len(keys)) - 0.2, [100 * cl[k]["acc"] for k in keys], 0.4, label="ACC")
        ax[0].bar(np.arange(len(keys)) + 0.2, [100 * cl[k]["nmi"] for k in keys], 0.4, label="NMI")
        ax[0].set_xticks(range(len(keys)), keys)
        ax[0].set_xlabel("epsilon per subgraph")
        ax[0].set_title("Citeseer 1-hop clustering (%)")
        ax[0].legend()
        ax[1].plot(keys, [cl[k]["gw_mean"] for k in keys], "o-")
        ax[1].set_title("mean GW discrepancy vs epsilon")
        fig.tight_layout()
        fig.savefig(RESULTS / "gw_ldp_citeseer.png", dpi=110)
        plt.close(fig)
    t1 = data.get("table1", {})
    if t1:
        fig, ax = plt.subplots(figsize=(8, 3.5))
        keys = list(t1)
        ours = [_ms(v["accs"] if "accs" in v else [r["svc_test_acc"] for r in v["runs"]]) for v in t1.values()]
        paper = [PAPER.get(tuple(k.split("|")), (np.nan, 0))[0] for k in keys]
        x = np.arange(len(keys))
        ax.bar(x - 0.2, paper, 0.4, label="paper")
        ax.bar(x + 0.2, [o[0] for o in ours], 0.4, yerr=[o[1] for o in ours], label="ours")
        ax.set_xticks(x, [k.replace("|", "\n") for k in keys], fontsize=7)
        ax.set_ylabel("SVC accuracy %")
        ax.legend()
        fig.tight_layout()
        fig.savefig(RESULTS / "gw_ldp_table1.png", dpi=110)
        plt.close(fig)


def main() -> int:
    global JSON_PATH
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--parts", default="timing,table1,cluster")
    ap.add_argument("--datasets", default="mutag")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=40)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--cluster-rounds", type=int, default=50)
    ap.add_argument("--centres", type=int, default=500)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--sample-pairs", type=int, default=2000)
    ap.add_argument("--sweep", default="1,10,100", help="extra MUTAG GIN epsilons per graph")
    ap.add_argument("--fresh", action="store_true", help="ignore stored results")
    ap.add_argument("--models", default="gin,gcn")
    ap.add_argument("--no-gw-a", dest="gw_a", action="store_false", help="skip the centralised GW_A baseline")
    ap.add_argument("--render-only", action="store_true")
    ap.add_argument("--json", default=str(JSON_PATH), help="results file (parts run separately can be merged)")
    ap.add_argument("--merge", default="", help="comma-separated result files to merge into --json first")
    args = ap.parse_args()
    JSON_PATH = Path(args.json)
    args.datasets = [d for d in args.datasets.split(",") if d]
    args.sweep = [float(x) for x in args.sweep.split(",") if x]
    args.models = [m for m in args.models.split(",") if m]
    data = {} if args.fresh else load_json()
    for extra in (p for p in args.merge.split(",") if p):
        for key, value in json.loads(Path(extra).read_text()).items():
            if isinstance(value, list):
                data.setdefault(key, []).extend(v for v in value if v not in data[key])
            else:
                data.setdefault(key, {}).update(value)
    if args.merge:
        save_json(data)
    parts = {"table1": part_table1, "cluster": part_cluster, "timing": part_timing}
    if not args.render_only:
        data.setdefault("commands", []).append(" ".join(sys.argv[1:]))
        for name in args.parts.split(","):
            parts[name](args, data)
    text = render(data, args)
    print(text)
    write_md(text)
    plots(data)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
