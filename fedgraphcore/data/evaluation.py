"""Evaluation files: what a deployed ServerApp may know for scoring a run.

In a deployment the server has no dataset. For experiments that report
metrics against ground truth, the operator gives the server an explicit
evaluation file (run-config ``eval-file``), written by
``python -m app.data.prepare ... --eval-file PATH``:

* ``labels-only`` (default): node labels (or graph labels) with the user's IDs, plus the graph's
  adjacency when ``--eval-graph`` is given (for modularity/conductance);
* ``full``: the pooled dataset, so the server can also run the centralised
  reference; only for research set-ups where pooling is allowed.

Format: one ``.npz`` (no pickle) with a JSON header.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import scipy.sparse as sp

from fedgraphcore.config import ConfigError
from fedgraphcore.data.fingerprint import data_hash
from fedgraphcore.data.shards import get_graphs, get_matrix, put_graphs, put_matrix
from fedgraphcore.data.types import GraphCollection, GraphData

CONTENTS = ("labels-only", "full")


def write_evaluation(data: GraphData | GraphCollection, path: str | Path, contents: str = "labels-only",
                     with_graph: bool = False) -> Path:
    """Write the evaluation file for ``data`` (see module docstring)."""
    if contents not in CONTENTS:
        raise ConfigError(f"invalid evaluation contents {contents!r}; valid choices: " + ", ".join(CONTENTS))
    arrays: dict[str, np.ndarray] = {}
    header = {"name": data.name, "contents": contents, "collection": isinstance(data, GraphCollection),
              "data_hash": data_hash(data)}  # which data the labels are of: see check_evaluation
    keys = data.graph_keys if isinstance(data, GraphCollection) else data.node_keys
    if keys is not None:  # the user's IDs, for the server's labels.csv
        arrays["keys"] = np.asarray(keys)
    if isinstance(data, GraphCollection):
        arrays["y"] = np.asarray(data.y)
        if contents == "full":
            header["graphs"] = put_graphs(arrays, data.graphs)
    else:
        if data.y is not None:
            arrays["y"] = np.asarray(data.y)
        header["num_nodes"] = data.num_nodes
        if contents == "full" or with_graph:
            header["adj"] = put_matrix(arrays, "adj", data.adj)
        if contents == "full":
            header["x"] = put_matrix(arrays, "x", data.x)
    arrays["__header__"] = np.frombuffer(json.dumps(header).encode(), dtype=np.uint8)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as f:
        np.savez(f, **arrays)
    return path


def load_evaluation(path: str | Path, dataset: str | None = None) -> GraphData | GraphCollection:
    """Read an evaluation file; ``meta['evaluation']`` says what it holds. With ``dataset``, a file
    made for another dataset is refused."""
    arrays, header = _read(path)
    if dataset is not None:
        _check_name(path, header, dataset)
    meta = {"evaluation": header["contents"]}
    if header["collection"]:
        graphs = get_graphs(arrays, header["graphs"]) if "graphs" in header else []
        return GraphCollection(header["name"], graphs, arrays["y"], meta=meta, graph_keys=arrays.get("keys"))
    n = int(header["num_nodes"])
    adj = get_matrix(arrays, "adj", header["adj"]) if "adj" in header else sp.csr_matrix((n, n))
    x = get_matrix(arrays, "x", header["x"]) if "x" in header else None
    return GraphData(header["name"], sp.csr_matrix(adj, dtype=np.float64), x, arrays.get("y"), meta,
                     node_keys=arrays.get("keys"))


def check_evaluation(path: str | Path, data: GraphData | GraphCollection) -> None:
    """Refuse an evaluation file made from other data than the run's ``data``: its labels would
    score other items, or stop the run once it is over when the sizes differ."""
    arrays, header = _read(path)
    _check_name(path, header, data.name)
    size, what = (len(data.y), "graphs") if isinstance(data, GraphCollection) else (data.num_nodes, "nodes")
    made = len(arrays["y"]) if header["collection"] else int(header["num_nodes"])
    valid = (f"valid: an eval-file written by python -m app.data.prepare --dataset {data.name} with the run's seed "
             "and dataset settings")
    if made != size:
        raise ConfigError(f"eval-file {str(path)!r} holds {made} {what} of '{data.name}', the run's '{data.name}' "
                          f"has {size}; {valid}")
    made_from = header.get("data_hash")  # None: a file written before the hash was recorded, checked by size only
    if made_from is not None and made_from != data_hash(data):
        raise ConfigError(f"eval-file {str(path)!r} was made from other '{data.name}' data than the run's (another "
                          f"seed or dataset setting); {valid}")


def _check_name(path: str | Path, header: dict, dataset: str) -> None:
    if header["name"] != dataset:
        raise ConfigError(f"eval-file {str(path)!r} was made for dataset {header['name']!r}, not {dataset!r}; "
                          f"valid: one written by python -m app.data.prepare --dataset {dataset} ... --eval-file PATH")


def _read(path: str | Path) -> tuple[dict[str, np.ndarray], dict]:
    """The arrays and the JSON header of an evaluation file."""
    path = Path(path)
    if not path.is_file():
        state = "is a directory" if path.is_dir() else "does not exist"
        raise ConfigError(f"eval-file {str(path)!r} {state}; write one with "
                          "python -m app.data.prepare ... --eval-file PATH")
    try:
        with np.load(path, allow_pickle=False) as z:
            arrays = {k: z[k] for k in z.files}
        header = json.loads(arrays.pop("__header__").tobytes())
    except Exception:  # np.load guesses the format; its message about pickles misleads for a text file
        raise ConfigError(f"eval-file {str(path)!r} is not an evaluation file (an .npz written by "
                          "python -m app.data.prepare ... --eval-file PATH)") from None
    return arrays, header
