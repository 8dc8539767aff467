"""A user's own data: every format gives the same graph, runs on it are identical, labels map back to
the user's IDs, bad files stop with one line naming the file and line, and no file runs code."""

from __future__ import annotations

import gzip
import json
import os
import pickle
from pathlib import Path

import networkx as nx
import numpy as np
import pandas as pd
import pytest
import scipy.sparse as sp

from fedgraphcore.config import ConfigError
from fedgraphcore.data import GraphCollection, load_dataset
from fedgraphcore.data.datasets import resolve_data_root
from fedgraphcore.data.formats import as_graph, read_graph, write_npz
from fedgraphcore.data.shards import data_hash

N = 24  # two communities of 12


def _graph_parts(seed: int = 0):
    """String node IDs, weighted edges (u, v, w), features exact in float32, text labels."""
    rng = np.random.default_rng(seed)
    ids = [f"user{i:02d}" for i in rng.permutation(N)]  # IDs not in row order
    side = np.arange(N) >= N // 2
    edges = []
    for i in range(N):
        for j in range(i + 1, N):
            if rng.random() < (0.5 if side[i] == side[j] else 0.04):
                edges.append((ids[i], ids[j], float(rng.integers(1, 4))))
    x = np.column_stack([side * 2.0 + rng.integers(0, 4, N) / 4, rng.integers(0, 8, N) / 8,
                         side * 1.5 + rng.integers(0, 4, N) / 8, rng.integers(0, 4, N) / 4])
    labels = np.where(side, "blue", "red")
    return ids, edges, x, labels


def _write_csv(directory: Path, parts, weighted: bool = True, shuffle: int = 1) -> tuple[Path, Path]:
    ids, edges, x, labels = parts
    rng = np.random.default_rng(shuffle)
    rows = [(v, u, w) if rng.random() < 0.5 else (u, v, w) for u, v, w in edges]  # either direction
    order = rng.permutation(len(rows))
    frame = pd.DataFrame([rows[i] for i in order], columns=["source", "target", "weight"])
    directory.mkdir(parents=True, exist_ok=True)
    edge_path, node_path = directory / "g.csv", directory / "nodes.csv"
    frame.to_csv(edge_path, index=False, columns=None if weighted else ["source", "target"])
    nodes = pd.DataFrame({"id": ids, **{f"f{j}": x[:, j] for j in range(x.shape[1])}, "label": labels})
    nodes = nodes.iloc[rng.permutation(N)]
    nodes.to_csv(node_path, index=False)
    return edge_path, node_path


def _write_npz(path: Path, parts) -> Path:
    ids, edges, x, labels = parts
    at = {k: i for i, k in enumerate(ids)}
    ei = np.array([[at[u] for u, _, _ in edges], [at[v] for _, v, _ in edges]])
    np.savez(path, edge_index=ei, edge_weight=np.array([w for *_, w in edges]), x=x, y=labels,
             node_ids=np.array(ids))
    return path


def _pyg(parts):
    import torch
    from torch_geometric.data import Data

    ids, edges, x, labels = parts
    at = {k: i for i, k in enumerate(ids)}
    ei = torch.tensor([[at[u] for u, _, _ in edges], [at[v] for _, v, _ in edges]])
    d = Data(x=torch.tensor(x, dtype=torch.float32), edge_index=ei,
             edge_weight=torch.tensor([w for *_, w in edges]), y=torch.tensor((labels == "red").astype(np.int64)))
    d.node_ids = list(ids)
    return d


def _networkx(parts) -> nx.Graph:
    ids, edges, x, labels = parts
    g = nx.Graph()
    for k, row, label in zip(ids, x, labels):
        g.add_node(k, x=row.tolist(), label=label)
    g.add_weighted_edges_from(edges)
    return g


@pytest.fixture(scope="module")
def parts():
    return _graph_parts()


@pytest.fixture(scope="module")
def files(tmp_path_factory, parts):
    import torch

    d = tmp_path_factory.mktemp("formats")
    edge_path, node_path = _write_csv(d / "csv", parts)
    torch.save(_pyg(parts), d / "g.pt")
    return {"csv": edge_path, "nodes": node_path, "npz": _write_npz(d / "g.npz", parts), "pt": d / "g.pt"}


# ----------------------------------------------------------------------------- one graph, every format


def test_every_format_gives_the_same_graph(files, parts):
    from_csv = read_graph(files["csv"], node_table=files["nodes"])
    others = {"npz": read_graph(files["npz"]), "pt": read_graph(files["pt"]), "networkx": as_graph(_networkx(parts), name="g")}
    assert from_csv.name == "g" and from_csv.validate() is from_csv and from_csv.weighted
    assert from_csv.node_keys.tolist() == sorted(parts[0]), "rows in ID order"
    assert from_csv.meta["label_names"] == ["blue", "red"]
    assert {k: data_hash(v) for k, v in others.items()} == {k: data_hash(from_csv) for k in others}
    # written and read back: the same arrays
    path = write_npz(from_csv, files["csv"].parent / "again.npz")
    assert data_hash(read_graph(path, name="g")) == data_hash(from_csv)
    # the same graph listed in another order, in either direction: the same rows
    edge_path, node_path = _write_csv(files["csv"].parent / "shuffled", parts, shuffle=7)
    assert data_hash(read_graph(edge_path, node_table=node_path)) == data_hash(from_csv)


def test_a_directory_with_edges_and_nodes_and_gzip(tmp_path, parts, files):
    directory = tmp_path / "g"
    directory.mkdir()
    (directory / "edges.csv").write_bytes(files["csv"].read_bytes())
    (directory / "nodes.csv").write_bytes(files["nodes"].read_bytes())
    expected = data_hash(read_graph(files["csv"], node_table=files["nodes"]))
    assert data_hash(read_graph(directory)) == expected
    with gzip.open(tmp_path / "g.csv.gz", "wb") as f:
        f.write(files["csv"].read_bytes())
    assert data_hash(read_graph(tmp_path / "g.csv.gz", node_table=files["nodes"])) == expected


def test_arrays_and_tuples(parts, files):
    g = read_graph(files["csv"], node_table=files["nodes"])
    same = as_graph((g.adj, g.x, g.y), name="g")
    assert (same.adj != g.adj).nnz == 0 and np.array_equal(same.x, g.x) and np.array_equal(same.y, g.y)
    assert same.node_keys is None
    dense = as_graph(g.adj.toarray(), weighted=False)
    assert set(dense.adj.data) == {1.0} and dense.num_edges == g.num_edges and dense.y is None


def test_integer_ids_sort_numerically_and_whitespace_lists(tmp_path):
    (tmp_path / "g.txt").write_text("# comment\n10 2\n2 3\n\n3 10\n100 2\n")
    g = read_graph(tmp_path / "g.txt")
    assert g.node_keys.tolist() == [2, 3, 10, 100] and g.num_edges == 4 and not g.weighted
    (tmp_path / "h.edges").write_text("0 1\n1 2\n2 0\n")
    assert read_graph(tmp_path / "h.edges").node_keys is None  # 0..n-1: the positions


def test_a_spreadsheet_export_with_byte_order_mark_and_crlf(tmp_path):
    (tmp_path / "g.csv").write_bytes(b"\xef\xbb\xbfSource,Target\r\na,b\r\nb,c\r\nc,c\r\n")
    g = read_graph(tmp_path / "g.csv")
    assert g.node_keys.tolist() == ["a", "b", "c"] and g.num_edges == 2
    assert g.meta["notes"] == [f"{tmp_path}/g.csv: 1 self-loop(s) dropped (first: line 4, node 'c')"]


# ----------------------------------------------------------------------------- runs


def _run(dataset, strategy: str, out: Path, **overrides):
    from app.run import run_experiment

    fast = {"kcagc.filter-order": 2} if strategy == "kcagc" else {}  # no adaptive order search
    result = run_experiment(strategy, str(dataset), 2, {"num-clusters": 2, **fast, **overrides}, out)
    return result, np.load(out / "labels.npy")


@pytest.mark.parametrize("strategy", ["fedkmeans", "kcagc"])
def test_runs_are_bit_identical_across_formats(strategy, files, tmp_path):
    csv, labels = _run(files["csv"], strategy, tmp_path / "csv", **{"data.node-table": str(files["nodes"])})
    for other in ("npz", "pt"):
        result, other_labels = _run(files[other], strategy, tmp_path / other)
        assert np.array_equal(labels, other_labels) and result["metrics"] == csv["metrics"]
        assert {k: v for k, v in result["reference"].items() if k != "time_s"} == \
            {k: v for k, v in csv["reference"].items() if k != "time_s"}


def test_labels_csv_maps_back_to_the_users_ids(files, parts, tmp_path):
    result, labels = _run(files["csv"], "fedkmeans", tmp_path / "r", **{"data.node-table": str(files["nodes"])})
    table = pd.read_csv(tmp_path / "r" / "labels.csv", dtype={"node": str})
    assert list(table.columns) == ["node", "cluster", "centralised"]  # the centralised labels item by item
    assert table["node"].tolist() == sorted(parts[0]) and np.array_equal(table["cluster"], labels)
    assert np.array_equal(table["centralised"], np.load(tmp_path / "r" / "reference_labels.npy"))
    ids, _, _, truth = parts
    cluster_of = dict(zip(table["node"], table["cluster"]))
    assert len({cluster_of[k] for k, t in zip(ids, truth) if t == "red"}) == 1  # one community, one cluster
    assert result["dataset"] == str(files["csv"]) and result["notes"] == []


def test_cli_notes_and_a_run_without_labels(tmp_path, capsys):
    from app.run import main

    lines = ["a,b", "b,c", "c,a", "c,c", "a,b", "d,e", "e,f", "f,d", "c,d"]
    (tmp_path / "g.csv").write_text("\n".join(lines) + "\n")
    argv = ["--engine", "inprocess", "--strategy", "fedspectral", "--dataset", str(tmp_path / "g.csv"),
            "--num-clients", "2", "--out", str(tmp_path / "r")]
    assert main(argv) == 2
    assert capsys.readouterr().err == (f"error: dataset {str(tmp_path / 'g.csv')!r} has no labels; valid: num-clusters "
                                       ">= 1 (the number of clusters to find)\n")
    assert main(argv + ["--set", "num-clusters=2"]) == 0
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("note: ")]
    assert err == [f"note: {tmp_path / 'g.csv'}: 1 self-loop(s) dropped (first: line 4, node 'c')",
                   f"note: {tmp_path / 'g.csv'}: 1 repeated edge(s) merged (first: line 5 repeats line 1, 'a' - 'b')"]
    result = json.loads((tmp_path / "r" / "result.json").read_text())
    assert result["notes"] == [e[len("note: "):] for e in err] and "modularity" in result["metrics"]
    assert "acc" not in result["metrics"] and "agreement" in result["reference"]


def test_weights_refused_by_a_method_that_counts_edges_and_taken_as_one_on_request(files, tmp_path):
    from app import registry
    from app.run import run_experiment

    with pytest.raises(ConfigError) as err:
        run_experiment("fedspectral-plus", str(files["csv"]), 2, {"num-clusters": 2}, tmp_path / "r")
    assert str(err.value) == (f"dataset {str(files['csv'])!r} has edge weights; strategy 'fedspectral-plus' bounds the "
                              "degrees by n and an edge's DP sensitivity by a unit weight (it counts every edge as 1); "
                              "valid: data.weighted=false (every edge weight 1) or an unweighted graph")
    registry.validate({"strategy": "fedspectral-plus", "dataset": str(files["csv"])})  # unknown until loaded
    result = run_experiment("fedspectral-plus", str(files["csv"]), 2,
                            {"num-clusters": 2, "data.weighted": False, "num-rounds": 2}, tmp_path / "r")
    assert result["metrics"]["modularity"] > 0


# ----------------------------------------------------------------------------- collections


def _collection_parts():
    """Three small graphs with text graph IDs and labels, node IDs per graph, one-hot node features."""
    graphs = {"g-b": ([(0, 1), (1, 2), (2, 0)], "ring"), "g-a": ([(0, 1), (1, 2), (2, 3)], "path"),
              "g-c": ([(5, 6), (6, 7), (7, 5), (5, 8)], "ring")}
    return graphs


def test_a_collection_in_the_csv_layout_tu_files_and_pyg(tmp_path):
    import torch
    from torch_geometric.data import Data

    graphs = _collection_parts()
    d = tmp_path / "csvdir"
    d.mkdir()
    pd.DataFrame([(g, label) for g, (_, label) in graphs.items()], columns=["graph", "label"]).to_csv(
        d / "graphs.csv", index=False)
    pd.DataFrame([(g, u, v) for g, (edges, _) in graphs.items() for u, v in edges],
                 columns=["graph", "source", "target"]).to_csv(d / "edges.csv", index=False)
    c = read_graph(d)
    assert isinstance(c, GraphCollection) and c.validate() is c and c.name == "csvdir"
    assert c.graph_keys.tolist() == ["g-a", "g-b", "g-c"] and c.y.tolist() == [0, 1, 1]
    assert [g.num_edges for g in c.graphs] == [3, 3, 4] and c.meta["label_names"] == ["path", "ring"]
    # the same graphs as TU files (graphs in ID order, 1-based global node numbers) and as PyG Data
    tu = tmp_path / "DEMO"
    tu.mkdir()
    ordered = [graphs[k] for k in sorted(graphs)]
    sizes = [len({n for e in edges for n in e}) for edges, _ in ordered]
    offsets = np.concatenate([[0], np.cumsum(sizes)])
    lines, data = [], []
    for (edges, label), start in zip(ordered, offsets):
        nodes = sorted({n for e in edges for n in e})
        at = {n: start + i + 1 for i, n in enumerate(nodes)}
        lines += [f"{at[u]}, {at[v]}\n{at[v]}, {at[u]}\n" for u, v in edges]
        local = [[at[u] - start - 1 for u, v in edges], [at[v] - start - 1 for u, v in edges]]
        data.append(Data(edge_index=torch.tensor(local), y=torch.tensor([int(label == "ring")]),
                         num_nodes=len(nodes)))
    (tu / "DEMO_A.txt").write_text("".join(lines))
    (tu / "DEMO_graph_indicator.txt").write_text("".join(f"{g + 1}\n" for g, n in enumerate(sizes) for _ in range(n)))
    (tu / "DEMO_graph_labels.txt").write_text("".join(f"{int(label == 'ring')}\n" for _, label in ordered))
    from_tu = read_graph(tu, name="csvdir")
    torch.save(data, tmp_path / "csvdir.pt")
    from_pyg = read_graph(tmp_path / "csvdir.pt")
    plain = GraphCollection("csvdir", c.graphs, c.y)
    assert data_hash(from_tu) == data_hash(from_pyg) == data_hash(plain)


def test_gw_ldp_runs_on_a_csv_collection(tmp_path):
    from app.run import run_experiment

    rng = np.random.default_rng(0)
    rows, labels = [], []
    for g in range(16):
        ring = g % 2 == 0
        n = int(rng.integers(5, 9))
        edges = [(i, (i + 1) % n) for i in range(n)] if ring else [(0, i) for i in range(1, n)]
        rows += [(f"m{g}", u, v) for u, v in edges]
        labels.append((f"m{g}", "ring" if ring else "star"))
    (tmp_path / "mols").mkdir()
    pd.DataFrame(rows, columns=["graph", "source", "target"]).to_csv(tmp_path / "mols" / "edges.csv", index=False)
    pd.DataFrame(labels, columns=["graph", "label"]).to_csv(tmp_path / "mols" / "graphs.csv", index=False)
    result = run_experiment("gw-ldp", str(tmp_path / "mols"), 2,
                            {"num-rounds": 1, "reference": False, "gw-ldp.model": "gcn", "gw-ldp.workers": 1},
                            tmp_path / "r")
    table = pd.read_csv(tmp_path / "r" / "labels.csv")
    assert list(table.columns) == ["graph", "cluster"] and table["graph"].tolist() == sorted(g for g, _ in labels)
    assert "acc" in result["metrics"]


# ----------------------------------------------------------------------------- .mat


def test_mat_file(tmp_path, files):
    import scipy.io as sio

    g = read_graph(files["csv"], node_table=files["nodes"])
    sio.savemat(tmp_path / "g.mat", {"W": g.adj, "fea": g.x, "gnd": (g.y + 1).reshape(-1, 1)})
    m = read_graph(tmp_path / "g.mat")
    assert (m.adj != g.adj).nnz == 0 and np.array_equal(m.x, g.x) and np.array_equal(m.y, g.y)
    assert set(read_graph(tmp_path / "g.mat", weighted=False).adj.data) == {1.0}


# ----------------------------------------------------------------------------- bad files


def _error(tmp_path, files: dict[str, str], main: str = "g.csv", **options) -> str:
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    with pytest.raises(ConfigError) as err:
        read_graph(tmp_path / main, **options)
    message = str(err.value)
    assert "\n" not in message
    return message


NODES = "id,f1,label\na,1,x\nb,2,y\nc,3,x\n"


@pytest.mark.parametrize("files, options, expected", [
    ({"g.csv": "source,target\na,b\nb,zed\n", "n.csv": NODES}, {"node_table": "n.csv"},
     "{d}/g.csv: line 3 names node 'zed', which {d}/n.csv does not list; valid: node IDs of the node table"),
    ({"g.csv": "a,b\nb,c\n", "n.csv": "id,f1,label\na,1,x\nb,two,y\nc,3,x\n"}, {"node_table": "n.csv"},
     "{d}/n.csv: line 3, column 'f1': 'two' is not a finite number; valid: numeric feature columns (name the label "
     "column with data.label-column)"),
    ({"g.csv": "a,b\nb,c\n", "n.csv": "id,f1,label\na,1,x\nb,nan,y\nc,3,x\n"}, {"node_table": "n.csv"},
     "{d}/n.csv: line 3, column 'f1': 'nan' is not a finite number; valid: numeric feature columns (name the label "
     "column with data.label-column)"),
    ({"g.csv": "a,b,1\nb,c,inf\n"}, {},
     "{d}/g.csv: line 2, column 'weight': 'inf' is not a finite number; valid: numeric edge weights"),
    ({"g.csv": "a,b,1\nb,c,-2\n"}, {},
     "{d}/g.csv: line 2, column 'weight': '-2' is not above 0 (leave a missing edge out); valid: numeric edge "
     "weights, finite, above 0"),
    ({"g.csv": "source,target\n"}, {}, "{d}/g.csv: no edges; valid: one edge or more a line, or a node table"),
    ({"g.csv": "a,b\nb,c,1,2\n"}, {}, "{d}/g.csv: line 2 has 4 fields; valid: 2 fields like the first row"),
    ({"g.csv": "a,b\nc\n"}, {}, "{d}/g.csv: line 2 has 1 field; valid: 2 fields like the first row"),
    ({"g.csv": "a,b\nb,c\n", "n.csv": "id,label\na,x\nb,x\nc,x\n"}, {"node_table": "n.csv"},
     "{d}/n.csv: column 'label' has one class ('x'); valid: two classes or more, or no labels (then set num-clusters)"),
    ({"g.csv": "a,b\nb,c\n", "n.csv": "id,f1\na,1\nb,2\na,3\nc,4\n"}, {"node_table": "n.csv"},
     "{d}/n.csv: line 4 repeats node ID 'a' of line 2; valid: each node ID once"),
    ({"g.csv": "a,b,1\nc,b,1\nb,a,2\n"}, {},
     "{d}/g.csv: line 3 ('b' - 'a', weight 2) reverses line 1 with weight 1; valid: one weight per undirected edge"),
    ({"g.csv": "a,b,1\na,b,2\n"}, {},
     "{d}/g.csv: line 2 ('a' - 'b', weight 2) repeats line 1 with weight 1; valid: one weight per undirected edge"),
    ({"g.csv": "a,b\n", "n.csv": "id,f1\na,1\nb,2\n"}, {"node_table": "n.csv", "label_column": "class"},
     "{d}/n.csv: no column 'class' (data.label-column); valid: one of f1"),
    ({"g.csv": "source,target,time\na,b,3\n"}, {},
     "{d}/g.csv: line 1: column 'time' is not a weight column; valid: the columns source, target[, weight] (weight "
     "named one of weight, w, value)"),
    ({"g.json": "{}"}, {}, "{d}/g.json: unknown format (suffix '.json'); valid: an edge list (.csv"),
    ({"g.csv": "person,friend\n1,2\n2,3\n"}, {},
     "{d}/g.csv: line 1 (person, friend) reads as a header with unknown column names; valid: a header naming source "
     "and target (source,target, src,dst, from,to, u,v) or no header"),
    ({"g.csv": "a,b\n", "n.csv": "user,age\na,3\nb,4\n"}, {"node_table": "n.csv"},
     "{d}/n.csv: line 1 is neither a header (its first column 'user' is not one of id, node, node_id, name) nor an "
     "ID followed by numbers; valid: a header row whose first column is named one of id, node, node_id, name"),
], ids=["unknown-node", "non-numeric-feature", "nan-feature", "inf-weight", "negative-weight", "empty", "ragged-long", "ragged-short",
        "one-class", "id-twice", "reverse-other-weight", "repeat-other-weight", "missing-label-column",
        "unknown-column", "unknown-format", "unnamed-header", "unnamed-node-header"])
def test_bad_files_stop_with_one_line_naming_file_and_line(tmp_path, files, options, expected):
    options = {k: tmp_path / v if k == "node_table" else v for k, v in options.items()}
    main = next(name for name in files if name.startswith("g."))
    message = _error(tmp_path, files, main, **options)
    assert message.startswith(expected.format(d=tmp_path)) and message.startswith(f"{tmp_path}/")


def test_repairs_are_said_not_errors(tmp_path):
    (tmp_path / "g.csv").write_text("a,b\nb,b\nb,c\na,b\n")
    (tmp_path / "n.csv").write_text("id,f1\na,1\nb,2\nc,3\nd,4\n")
    g = read_graph(tmp_path / "g.csv", node_table=tmp_path / "n.csv")
    assert g.meta["notes"] == [f"{tmp_path}/g.csv: 1 self-loop(s) dropped (first: line 2, node 'b')",
                               f"{tmp_path}/g.csv: 1 repeated edge(s) merged (first: line 4 repeats line 1, 'a' - 'b')",
                               f"{tmp_path}/g.csv: 1 isolated node(s) kept, without an edge (first: 'd')"]
    assert g.num_nodes == 4 and g.num_edges == 2


def test_bad_arrays_and_objects(tmp_path):
    np.savez(tmp_path / "empty.npz", x=np.zeros((0, 2)))
    np.savez(tmp_path / "objects.npz", x=np.array([{"a": 1}], dtype=object))
    np.savez(tmp_path / "typo.npz", edge_indx=np.zeros((2, 1), int))
    np.savez(tmp_path / "both.npz", edge_index=np.zeros((2, 1), int), adj_data=np.ones(1))
    for name, expected in (("empty", "no nodes (an empty graph); valid: at least one edge or node-table row"),
                           ("both", "both edge_index and adj_data; valid: one of them"),
                           ("objects", "array 'x' holds Python objects (pickled); valid: numeric or string arrays"),
                           ("typo", "unknown array 'edge_indx'; valid: arrays named edge_index, edge_weight,")):
        with pytest.raises(ConfigError) as err:
            read_graph(tmp_path / f"{name}.npz")
        assert str(err.value).startswith(f"{tmp_path / name}.npz: {expected}")
    g = nx.Graph([("a", "b")])
    g.add_node("c", x=[1.0])
    with pytest.raises(ConfigError, match=r"^networkx graph 'graph': node 'a' has no attribute 'x' \(other nodes have "
                                          r"one\); valid: x on every node or on none$"):
        as_graph(g)


def test_a_torch_file_that_is_not_a_data(tmp_path):
    import torch

    torch.save({"edge_index": torch.zeros((2, 1), dtype=torch.long)}, tmp_path / "d.pt")
    with pytest.raises(ConfigError) as err:
        read_graph(tmp_path / "d.pt")
    assert str(err.value) == (f"{tmp_path}/d.pt: is not a PyG Data (it holds a dict); valid: a torch_geometric Data or "
                              "a non-empty list of Data")


# ----------------------------------------------------------------------------- files that would run code


class _Payload:
    """Unpickled by a plain pickle.load, this creates the marker file."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


def test_a_crafted_torch_file_does_not_run(tmp_path):
    import torch

    marker = tmp_path / "ran"
    torch.save({"x": _Payload(marker)}, tmp_path / "evil.pt")
    with pytest.raises(ConfigError) as err:
        read_graph(tmp_path / "evil.pt")
    assert not marker.exists()
    assert str(err.value) == (f"{tmp_path}/evil.pt is not a PyG Data (it refers to {os.system.__module__}.system, "
                              "which weights-only loading refuses); valid: torch.save of a torch_geometric Data or a "
                              "list of Data")


def _planetoid(raw: Path, prefix: str, gap: bool) -> None:
    """A small Planetoid set as the published files are: pickled CSR features, one-hot label arrays, a
    defaultdict of neighbours; with ``gap`` two test nodes missing from tx/ty (citeseer's case)."""
    from collections import defaultdict

    rng = np.random.default_rng(1)
    train, allx_rows, f, c = 6, 510, 7, 3  # PyG takes the 500 rows after the training rows for validation
    test_index = np.array([512, 510, 516, 511, 514] if gap else [513, 510, 512, 514, 511])
    n = int(test_index.max()) + 1
    feats = lambda rows: sp.csr_matrix((rng.random((rows, f)) < 0.4).astype(np.float32))  # noqa: E731
    onehot = lambda rows: np.eye(c)[rng.integers(0, c, rows)]  # noqa: E731
    parts = {"x": feats(train), "tx": feats(len(test_index)), "allx": feats(allx_rows), "y": onehot(train),
             "ty": onehot(len(test_index)), "ally": onehot(allx_rows)}
    graph = defaultdict(list)
    for i in range(n):
        graph[i] += [int(j) for j in rng.choice(n, 2, replace=False)]
    parts["graph"] = graph
    raw.mkdir(parents=True)
    for name, value in parts.items():
        (raw / f"ind.{prefix}.{name}").write_bytes(pickle.dumps(value, protocol=2))
    (raw / f"ind.{prefix}.test.index").write_text("".join(f"{i}\n" for i in test_index))


@pytest.mark.parametrize("prefix, gap", [("demo", False), ("citeseer", True)])
def test_planetoid_files_read_as_pyg_reads_them(tmp_path, prefix, gap):
    from torch_geometric.io.planetoid import read_planetoid_data

    from fedgraphcore.data.datasets import symmetric_adjacency

    raw = tmp_path / "raw"
    _planetoid(raw, prefix, gap)
    ours = read_graph(raw)
    theirs = read_planetoid_data(str(raw), prefix)  # PyG's own reader, on files this test wrote
    ei = theirs.edge_index.numpy()
    assert (ours.adj != symmetric_adjacency(ei[0], ei[1], theirs.num_nodes)).nnz == 0
    assert np.array_equal(ours.x.toarray(), theirs.x.numpy()) and np.array_equal(ours.y, theirs.y.numpy())


def test_a_crafted_planetoid_file_does_not_run(tmp_path):
    raw = tmp_path / "raw"
    _planetoid(raw, "cora", False)
    marker = tmp_path / "ran"
    (raw / "ind.cora.x").write_bytes(pickle.dumps(_Payload(marker)))
    with pytest.raises(ConfigError) as err:
        read_graph(raw)
    assert not marker.exists()
    assert str(err.value) == (f"{raw}/ind.cora.x: not a Planetoid pickle (UnpicklingError: global "
                              f"'{os.system.__module__}.system' is not allowed); valid: the files of "
                              "github.com/kimiyoung/planetoid (numpy arrays, a scipy CSR matrix, a dict of lists)")


# ----------------------------------------------------------------------------- dataset=PATH


def test_dataset_values(tmp_path):
    from app import registry

    with pytest.raises(ConfigError, match=r"^invalid value 'nowhere' for 'dataset': neither a built-in dataset "
                                          r"nor an existing file or directory; valid: a built-in dataset \(karate, "):
        registry.validate({"dataset": "nowhere"})
    # a path that is not here: a deployed SuperNode reads its own files; where it is read, it is missing
    registry.validate({"dataset": str(tmp_path / "elsewhere.csv")})
    with pytest.raises(ConfigError, match=rf"^{tmp_path}/elsewhere\.csv: no such file or directory; valid: an edge "):
        load_dataset(str(tmp_path / "elsewhere.csv"))
    (tmp_path / "g.json").write_text("{}")
    with pytest.raises(ConfigError, match=r"'dataset': unknown format \(suffix '\.json'\); valid: a built-in"):
        registry.validate({"dataset": str(tmp_path / "g.json")})
    (tmp_path / "g.csv").write_text("a,b\n")
    with pytest.raises(ConfigError, match="unknown parameter 'nodes' for dataset .*; valid parameters: node_table, "
                                          "label_column, weighted$"):
        load_dataset(str(tmp_path / "g.csv"), nodes=3)


# ----------------------------------------------------------------------------- built-ins


#: data_hash of every built-in as loaded before the readers of fedgraphcore.data.formats replaced PyG's loaders.
BUILTIN_HASHES = {
    "karate": "acf7db2fd8aacabc65c7759fc091d467af0ea397035402e0f1ffba2910dfcb64",
    "sbm": "00daba138082d165d15db8dac0f9c013ccded8f07c3c48799c7129bd42cb84e9",
    "iris": "daebd65c9b0eefc6e2d5455bfccd1055a7530f9d1fe7dc02ccf8d7e7b567b1b0",
    "digits": "869d5643d0f7d1c48bc4b28d78b8d54602be814b877a76372e513f767e2e6de9",
    "circles": "2823d66fbe5631e81162985b609d9741e084abdd1419752bf5e1c745e6e9f803",
    "cora": "4e67502bf91343021493f8a1d71f5301c5df9b584941bac678eb03b9b1aca1a3",
    "citeseer": "bca557675658177af55757d89dbfabefa2b0ae5b1c67a924a2675f509fbdea1f",
    "wiki": "7083c97fa26f96242716fc81124d4cff786f38af089dff8380a8c399b8e03431",
    "mutag": "9c55158815e657595c2600bd5fff6300d3581032ae90b315075b81520c8e6c10",
    "proteins": "f400270daab845c113479f52eca6a8871375f9e9428926c3b4f3c09145c5a3bd",
    "imdb-binary": "c3c9a6e308bbc6773350f034cbf9a4c130bfe00395bb1bc8cbdebbdaa937ef8c",
    "email-eu-core": "ead5b7f1b056c31007682d2d5b3855fbe004c62713af0c70ca6b102a33cb9c24",
    "ego-facebook": "eebe5e33eb8c6ca7bd9e34b7d82992ab426372b740f14af61daf9dc84089fbb7",
}


def test_builtins_load_to_the_same_arrays_and_profiles():
    from fedgraphcore.data.datasets import BUILTIN_PROFILES, FILE_DATASETS, DataProfile

    root = resolve_data_root(None)
    if root is None or not (root / "planetoid" / "Cora").is_dir():
        pytest.skip("shared datasets not found (set FEDGRAPH_DATA_ROOT)")
    for name, expected in BUILTIN_HASHES.items():
        data = load_dataset(name, data_root=root)
        assert data_hash(data) == expected, name
        assert DataProfile.of(data) == BUILTIN_PROFILES[name], name
        assert isinstance(data, GraphCollection) or data.node_keys is None
    assert set(BUILTIN_HASHES) | {"pubmed"} >= set(FILE_DATASETS)
