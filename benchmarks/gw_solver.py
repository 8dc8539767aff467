"""The GW matrix's solvers side by side on the same inputs: ``cg`` (the project's conditional
gradient, :mod:`fedgraphcore.protocols.gw_ldp.solver`) against ``pot`` (``ot.gromov.gromov_wasserstein2``).

    python benchmarks/gw_solver.py [--pairs 300] [--datasets mutag,proteins,imdb-binary]

Per dataset, a sample of graph pairs in two metric-measure spaces: shortest paths (GW_A) and
LDP codes of 2-class embeddings at epsilon = 1/|V| with multiplicity weights (the GW_H* upload).
Each pair is solved by both solvers in turn in this process on one BLAS thread; CPU seconds
(``time.process_time``) are load-independent enough to give the ratio. Also one whole GW_A
matrix (MUTAG's first 100 graphs) with 1 and 2 workers, both solvers: the four matrices must be equal. Prints the
figures and writes ``benchmarks/results/gw_solver.json``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
from threadpoolctl import threadpool_limits

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from fedgraphcore.data import load_dataset  # noqa: E402
from fedgraphcore.protocols import gw_ldp  # noqa: E402

JSON_PATH = ROOT / "benchmarks" / "results" / "gw_solver.json"


def spaces_of(name: str, rng: np.random.Generator) -> dict[str, list]:
    """Per space kind, every graph's (distance matrix, weights)."""
    graphs = load_dataset(name).graphs
    paths = []
    for g in graphs:
        c = gw_ldp.shortest_path_matrix(g.adj)
        paths.append((c, np.full(c.shape[0], 1.0 / c.shape[0])))
    codes = [gw_ldp.embedding_space(gw_ldp.encode_graph(rng.dirichlet(np.ones(2), size=g.num_nodes),
                                                      1.0 / g.num_nodes, rng)[0]) for g in graphs]
    return {"shortest_paths": paths, "ldp_codes": codes}


def compare(spaces: list, pairs: list) -> dict:
    """Both solvers on every pair: CPU seconds each, their ratio, and how far the values differ."""
    i, j = pairs[0]
    for solver in ("pot", "cg"):  # first calls pay imports and backend set-up: not timed
        gw_ldp.gw_pair(spaces[i][0], spaces[j][0], spaces[i][1], spaces[j][1], solver=solver)
    cpu = {"cg": 0.0, "pot": 0.0}
    values = {"cg": [], "pot": []}
    for i, j in pairs:
        for solver in ("pot", "cg"):
            t0 = time.process_time()
            values[solver].append(gw_ldp.gw_pair(spaces[i][0], spaces[j][0], spaces[i][1], spaces[j][1],
                                                solver=solver))
            cpu[solver] += time.process_time() - t0
    cg, pot = np.array(values["cg"]), np.array(values["pot"])
    diff = np.abs(cg - pot)
    return {"pairs": len(pairs), "cg_ms_per_pair": 1e3 * cpu["cg"] / len(pairs),
            "pot_ms_per_pair": 1e3 * cpu["pot"] / len(pairs), "speedup": cpu["pot"] / cpu["cg"],
            "max_abs_diff": float(diff.max()), "max_rel_diff": float((diff / np.maximum(np.abs(pot), 1e-300)).max()),
            "identical": int((cg == pot).sum())}


def whole_matrix() -> dict:
    """The GW_A matrix of MUTAG's first 100 graphs by both solvers with 1 and 2 workers (wall
    seconds on a shared machine; are all four equal?)."""
    mats = [gw_ldp.shortest_path_matrix(g.adj) for g in load_dataset("mutag").graphs[:100]]
    out, first = {}, None
    for solver in ("pot", "cg"):
        for workers in (1, 2):
            t0 = time.perf_counter()
            d = gw_ldp.gw_matrix(mats, workers, solver=solver)
            out[f"{solver}_workers{workers}_s"] = time.perf_counter() - t0
            first = d if first is None else first
            out[f"{solver}_workers{workers}_equal"] = bool(np.array_equal(d, first))
            print(f"  MUTAG GW_A matrix {solver}, {workers} worker(s): {out[f'{solver}_workers{workers}_s']:.1f} s"
                  f" wall, equal to pot/1: {out[f'{solver}_workers{workers}_equal']}", flush=True)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=300)
    parser.add_argument("--datasets", default="mutag,proteins,imdb-binary")
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    result = {"pairs": {}}
    with threadpool_limits(limits=1):
        for name in args.datasets.split(","):
            for kind, spaces in spaces_of(name, rng).items():
                pairs = [tuple(rng.choice(len(spaces), 2, replace=False)) for _ in range(args.pairs)]
                row = compare(spaces, pairs)
                result["pairs"][f"{name}/{kind}"] = row
                print(f"  {name} {kind}: pot {row['pot_ms_per_pair']:.2f} ms, cg {row['cg_ms_per_pair']:.2f} ms "
                      f"per pair (CPU), x{row['speedup']:.2f}; max |diff| {row['max_abs_diff']:.3g}, "
                      f"identical {row['identical']}/{row['pairs']}", flush=True)
    result["mutag_matrix"] = whole_matrix()
    JSON_PATH.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {JSON_PATH}")


if __name__ == "__main__":
    main()
