"""A corpus of bad and tricky inputs, each read as a new user's files would be, with the outcome it must give.

Every case writes a small dataset (a folder ``g/`` with ``edges.csv`` and ``nodes.csv``, or one file)
and reads it as ``python -m app.run --dataset PATH`` does (:func:`fedgraphcore.data.formats.read_graph`). The
outcome is either read (then a check on what was read: the rows, the labels, the notes) or refused
with one line that names the file, the line where there is one, and the value as written. No case
may end in another exception (a traceback), read a label as a feature, drop a row silently, or run
code. The summary test prints the count of outcomes; the corpus covers every input friction of the
first-day report: ragged rows under a label column (first, middle and last line, too few and too
many fields), a ragged first row blamed on the right file and line, a header-only edges.csv beside a
node table, symlink loops, huge and overflowing numbers quoted as written, pickles inside an .npz,
compression bombs (.npz and .gz) and the usual suspects (encodings, blank lines, comments, quotes,
IDs, weights, labels).
"""

from __future__ import annotations

import gzip
import io
import os
import pickle
import re
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import pytest

from fedgraphcore.config import ConfigError
from fedgraphcore.data.formats import read_graph

HEADER = "id,age,income,label"
NODES = ["a,1.0,2.0,x", "b,1.5,2.5,x", "c,9.0,8.0,y", "d,9.5,8.5,y", "e,5.0,5.0,x"]
EDGES = ["source,target", "a,b", "b,c", "c,d", "d,e", "e,a"]


@dataclass
class Case:
    """One input: files to write (name -> text or bytes, or a callable writing into the folder), how
    it is read (``read_graph`` of the folder or of ``target``), and the outcome it must give: a
    ``check`` on the graph read, or ``refused``, a pattern the one-line error must match."""

    name: str
    files: dict
    refused: str | None = None
    check: Callable | None = None
    target: str = "g"
    options: dict | None = None


def folder(nodes: list[str] | None = None, edges: list[str] | None = None, header: str = HEADER) -> dict:
    files = {}
    if nodes is not None:
        files["g/nodes.csv"] = "\n".join([header] + nodes) + "\n"
    if edges is not None:
        files["g/edges.csv"] = "\n".join(edges) + "\n"
    return files


def nodes_with(line: int, text: str, edges: list[str] | None = EDGES) -> dict:
    rows = list(NODES)
    rows[line] = text
    return folder(rows, edges)


def rows_and_labels(n: int, labelled: int) -> Callable:
    def check(g):
        assert g.num_nodes == n and g.x.shape == (n, 2)
        assert int((g.y >= 0).sum()) == labelled
    return check


def npz_bytes(**arrays) -> bytes:
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    return buffer.getvalue()


def npz_with_member(name: str, payload: bytes) -> bytes:
    """An .npz whose member ``name`` is raw bytes (not an .npy): e.g. a pickle."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as z:
        z.writestr("edge_index.npy", npz_member(np.array([[0, 1], [1, 2]])))
        z.writestr(name, payload)
    return buffer.getvalue()


def npz_member(a: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, a)
    return buffer.getvalue()


def npz_bomb() -> bytes:
    """An .npz of one all-zero float array of 70 MB, compressed about 1,000 times."""
    count = 70_000_000 // 8
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", compression=zipfile.ZIP_DEFLATED) as z:
        with z.open("x.npy", "w", force_zip64=True) as f:
            header = io.BytesIO()
            np.lib.format.write_array_header_1_0(header, {"descr": "<f8", "fortran_order": False,
                                                          "shape": (count, 1)})
            f.write(header.getvalue())
            left = count * 8
            while left:
                f.write(bytes(min(left, 1 << 20)))
                left -= min(left, 1 << 20)
    return buffer.getvalue()


def gz_bomb() -> bytes:
    """A .csv.gz edge list whose text is 200 MB of blank lines after one edge."""
    buffer = io.BytesIO()
    with gzip.GzipFile(fileobj=buffer, mode="wb", compresslevel=9) as f:
        f.write(b"source,target\na,b\n")
        chunk = b"\n" * (1 << 20)
        for _ in range(200):
            f.write(chunk)
    return buffer.getvalue()


def symlink_loop(name: str) -> Callable:
    def make(root: Path) -> None:
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        os.symlink(path.name, path)  # a link to itself
    return make


def labels_kept(g) -> None:
    assert g.num_nodes == 5 and g.x.shape == (5, 2) and (g.y >= 0).all()


def edges_of(count: int) -> Callable:
    def check(g):
        assert g.num_edges == count
    return check


def noted(pattern: str) -> Callable:
    def check(g):
        assert any(re.search(pattern, note) for note in g.meta.get("notes", [])), g.meta.get("notes")
    return check


CASES = [
    # -- the node table under a label column: every row whole, whichever line is short or long
    Case("well formed", folder(NODES, EDGES), check=labels_kept),
    Case("ragged node row, first line (a cell missing)", nodes_with(0, "a,1.0,x"),
         refused=r"nodes\.csv: line 2 has 3 fields; valid: 4 fields"),
    Case("ragged node row, middle line", nodes_with(2, "c,9.0,y"), refused=r"nodes\.csv: line 4 has 3 fields"),
    Case("ragged node row, last line", nodes_with(4, "e,5.0,x"), refused=r"nodes\.csv: line 6 has 3 fields"),
    Case("ragged node row, label cell missing", nodes_with(1, "b,1.5,2.5"), refused=r"nodes\.csv: line 3 has 3 fields"),
    Case("node row with a field too many, first line", nodes_with(0, "a,1.0,2.0,x,7"),
         refused=r"nodes\.csv: line 2 has 5 fields; valid: 4 fields"),
    Case("node row with a field too many, last line", nodes_with(4, "e,5.0,5.0,x,7"),
         refused=r"nodes\.csv: line 6 has 5 fields"),
    Case("ragged node row without a label column", folder(["a,1.0,2.0", "b,1.5", "c,9.0,8.0"], None,
                                                           header="id,age,income"),
         refused=r"nodes\.csv: line 3 has 2 fields; valid: 3 fields"),
    Case("empty label cell: unknown label", nodes_with(2, "c,9.0,8.0,"), check=rows_and_labels(5, 4)),
    Case("empty feature cell", nodes_with(2, "c,,8.0,y"), refused=r"nodes\.csv: line 4, column 'age': '' is not a "
                                                                    r"finite number"),
    Case("a feature written with a decimal comma", folder([*NODES[:4], 'e,"5,0",5.0,x'], EDGES),
         refused=r"line 6, column 'age': '5,0' is not a finite number"),
    Case("a feature of 1e308 (its square overflows)", nodes_with(1, "b,1e308,2.5,x"),
         refused=r"nodes\.csv: line 3, column 'age': '1e308' is out of range"),
    Case("a feature of 1e309 quoted as written", nodes_with(1, "b,1e309,2.5,x"),
         refused=r"line 3, column 'age': '1e309' is not a finite number"),
    Case("a feature of -1E+309 quoted as written", nodes_with(1, "b,-1E+309,2.5,x"),
         refused=r"line 3, column 'age': '-1E\+309' is not a finite number"),
    Case("a feature 'inf'", nodes_with(3, "d,inf,8.5,y"), refused=r"line 5, column 'age': 'inf' is not a finite"),
    Case("a feature 'nan'", nodes_with(3, "d,nan,8.5,y"), refused=r"line 5, column 'age': 'nan' is not a finite"),
    Case("a feature 'NaN' in the last column", folder(["a,1.0,2.0", "b,1.5,NaN"], None, header="id,age,income"),
         refused=r"line 3, column 'income': 'NaN' is not a finite"),
    Case("a text feature", nodes_with(3, "d,old,8.5,y"), refused=r"line 5, column 'age': 'old' is not a finite"),
    Case("a feature of 1e-320 (subnormal, finite)", nodes_with(3, "d,1e-320,8.5,y"), check=labels_kept),
    Case("a repeated node ID", nodes_with(3, "a,9.5,8.5,y"), refused=r"nodes\.csv: line 5 repeats node ID 'a' of "
                                                                     r"line 2"),
    Case("a node row without an ID", nodes_with(3, ",9.5,8.5,y"), refused=r"nodes\.csv: line 5 has no ID; valid: an ID"),
    Case("one label class only", folder([r[:-1] + "x" for r in NODES], EDGES), refused=r"one class|two classes"),
    Case("a label column that holds numbers", folder([r[:-1] + str(i % 2) for i, r in enumerate(NODES)], EDGES),
         check=labels_kept),
    Case("a node table with a header only", folder([], EDGES), refused=r"nodes\.csv: no rows"),
    Case("an empty nodes.csv", {"g/nodes.csv": "", "g/edges.csv": "\n".join(EDGES) + "\n"},
         refused=r"nodes\.csv: (no rows|line \d+ is neither)"),
    Case("a byte-order mark before the header", {"g/nodes.csv": "\ufeff" + HEADER + "\n" + "\n".join(NODES) + "\n",
                                                 "g/edges.csv": "\n".join(EDGES) + "\n"}, check=labels_kept),
    Case("Windows line ends", {"g/nodes.csv": "\r\n".join([HEADER] + NODES) + "\r\n",
                               "g/edges.csv": "\r\n".join(EDGES) + "\r\n"}, check=labels_kept),
    Case("blank lines and comments", {"g/nodes.csv": "# exported\n" + HEADER + "\n\n" + "\n".join(NODES) + "\n\n",
                                      "g/edges.csv": "\n".join(EDGES) + "\n# end\n"}, check=labels_kept),
    Case("quoted IDs with a comma inside", folder(['"a,1",1.0,2.0,x', *NODES[1:]], ["source,target", '"a,1",b', "b,c"]),
         check=lambda g: "a,1" in list(g.keys)),
    Case("spaces after the commas", folder([r.replace(",", ", ") for r in NODES], EDGES), check=labels_kept),
    Case("latin-1 bytes (not UTF-8)", {"g/nodes.csv": (HEADER + "\n" + "\n".join(NODES) + "\n").replace(
        "a,1.0", "\u00e9,1.0").encode("latin-1"), "g/edges.csv": "\n".join(EDGES) + "\n"},
         refused=r"nodes\.csv: not a UTF-8 text file"),
    Case("a label column named by data.label-column", folder([r for r in NODES], EDGES, header="id,age,income,kind"),
         options={"label_column": "kind"}, check=labels_kept),
    Case("data.label-column naming no column", folder(NODES, EDGES), options={"label_column": "class"},
         refused=r"no column 'class' \(data.label-column\); valid: one of age, income, label"),
    Case("a header whose first column is no ID name", folder(NODES, EDGES, header="key,age,income,label"),
         refused=r"nodes\.csv: line 1 is neither a header"),
    Case("a header naming a column twice", folder(NODES, EDGES, header="id,age,age,label"),
         refused=r"nodes\.csv: line 1 names a column twice"),
    # -- the edge list
    Case("ragged first edge row (a field missing)", folder(NODES, ["source,target", "a", "b,c", "c,d"]),
         refused=r"edges\.csv: line 2 has 1 fields?; valid: 2 fields"),
    Case("ragged first edge row (a field too many)", folder(NODES, ["source,target", "a,b,c", "b,c"]),
         refused=r"edges\.csv: line 2 has 3 fields; valid: 2 fields"),
    Case("ragged last edge row", folder(NODES, ["source,target", "a,b", "b,c", "d"]),
         refused=r"edges\.csv: line 4 has 1 fields?; valid: 2 fields"),
    Case("edge rows without a header, one ragged", folder(NODES, ["a,b", "b", "c,d"]),
         refused=r"edges\.csv: line 2 has 1 fields?; valid: 2 fields"),
    Case("an empty target", folder(NODES, ["source,target", "a,b", "b,", "c,d"]),
         refused=r"edges\.csv: line 3 has no target ID"),
    Case("an edge to a node the node table does not list", folder(NODES, ["source,target", "a,b", "b,zz"]),
         refused=r"edges\.csv: line 3 names node 'zz', which .*nodes\.csv does not list"),
    Case("a header-only edges.csv beside a node table: a graph without edges", folder(NODES, ["source,target"]),
         check=edges_of(0)),
    Case("an empty edges.csv beside a node table: a graph without edges", {**folder(NODES), "g/edges.csv": ""},
         check=edges_of(0)),
    Case("a header-only edges.csv alone", folder(None, ["source,target"]),
         refused=r"edges\.csv: no edges; valid: one edge or more a line, or a node table \(nodes\.csv"),
    Case("self-loops are dropped, with a note", folder(NODES, [*EDGES, "a,a"]), check=noted("self-loop")),
    Case("a repeated edge is merged, with a note", folder(NODES, [*EDGES, "a,b"]), check=noted("repeated edge")),
    Case("an edge listed both ways is one edge", folder(NODES, [*EDGES, "b,a"]), check=edges_of(5)),
    Case("a weight column", folder(NODES, ["source,target,weight", "a,b,2", "b,c,0.5"]), check=edges_of(2)),
    Case("a text weight", folder(NODES, ["source,target,weight", "a,b,heavy"]),
         refused=r"edges\.csv: line 2, column 'weight': 'heavy' is not a finite number"),
    Case("a weight of 1e309 quoted as written", folder(NODES, ["source,target,weight", "a,b,1e309"]),
         refused=r"line 2, column 'weight': '1e309' is not a finite number"),
    Case("a negative weight", folder(NODES, ["source,target,weight", "a,b,-1"]),
         refused=r"edges\.csv: line 2, column 'weight': '-1' is not above 0"),
    Case("a zero weight", folder(NODES, ["source,target,weight", "a,b,0", "b,c,1"]),
         refused=r"edges\.csv: line 2, column 'weight': '0' is not above 0"),
    Case("an unknown third column", folder(NODES, ["source,target,colour", "a,b,red"]),
         refused=r"edges\.csv: line 1: column 'colour' is not a weight column"),
    Case("integer IDs with leading zeros are one node", folder(["1,1.0,2.0,x", "2,1.5,2.5,x", "3,9.0,8.0,y"],
                                                               ["source,target", "001,2", "2,3"]), check=edges_of(2)),
    Case("an edge list with a tab in a .csv", folder(NODES, ["source\ttarget", "a\tb"]),
         refused=r"edges\.csv: line 1 has 1 field; valid: 2 \(source, target\) or 3"),
    Case("an edge list header with unknown names over integer IDs",
         {"g/edges.csv": "from_node,to_node\n1,2\n2,3\n3,1\n"}, refused=r"reads as a header with unknown column names"),
    Case("a weight missing on one line under a weight header", folder(NODES, ["source,target,weight", "a,b,1", "b,c"]),
         refused=r"edges\.csv: line 3 has 2 fields; valid: 3 fields like the header"),
    Case("an edge and its reverse with different weights", folder(NODES, ["source,target,weight", "a,b,1", "b,a,2"]),
         refused=r"edges\.csv"),
    Case("a weight that underflows to zero", folder(NODES, ["source,target,weight", "a,b,1e-400", "b,c,1"]),
         refused=r"edges\.csv: line 2, column 'weight': '1e-400' is not above 0"),
    Case("a whitespace edge list with weights", {"g.txt": "a b 1.5\nb c 2\n# a comment\nc a 1\n"}, target="g.txt",
         check=edges_of(3)),
    Case("a whitespace edge list with a ragged row", {"g.txt": "a b\nb c 2\nc a\n"}, target="g.txt",
         refused=r"g\.txt: line 2 has 3 fields; valid: 2 fields"),
    Case("a tab-separated folder", {"g/edges.tsv": "source\ttarget\na\tb\nb\tc\n",
                                    "g/nodes.tsv": "id\tage\na\t1\nb\t2\nc\t3\n"}, check=edges_of(2)),
    Case("only comments", {"g/edges.csv": "# nothing yet\n# really\n"}, refused=r"edges\.csv: no edges"),
    Case("IDs that are integers in one file and text in the other", folder(["1,1.0,2.0,x", "2,1.5,2.5,y"],
                                                                           ["source,target", "1,b"]),
         refused=r"edges\.csv: line 2 names node 'b', which .*nodes\.csv does not list"),
    Case("'007' and '7' are one node ID", folder(["7,1.0,2.0,x", "007,1.5,2.5,y"], ["source,target", "7,007"]),
         refused=r"nodes\.csv: line 3 repeats node ID 7 of line 2"),
    Case("UTF-8 IDs with accents", folder(["\u00e9l\u00e8ve,1.0,2.0,x", "b,1.5,2.5,y"], ["source,target", "\u00e9l\u00e8ve,b"]),
         check=lambda g: "\u00e9l\u00e8ve" in list(g.keys)),
    Case("a node table with an ID column only", folder(["a", "b", "c"], ["source,target", "a,b", "b,c"], header="id"),
         check=lambda g: g.x is None and g.num_edges == 2),
    Case("a thousand feature columns", folder([f"n{i}," + ",".join(["1.5"] * 1000) + f",{'xy'[i % 2]}" for i in range(4)],
                                             ["source,target", "n0,n1"],
                                             header="id," + ",".join(f"f{j}" for j in range(1000)) + ",label"),
         check=lambda g: g.x.shape == (4, 1000)),
    Case("a label column named with spaces around the values", folder([r[:-1] + " " + r[-1] + " " for r in NODES], EDGES),
         check=labels_kept),
    Case("data.node-table naming a missing file", folder(None, EDGES), options={"node_table": "g/missing.csv"},
         refused=r"missing\.csv: no such file \(data\.node-table\)"),
    Case("a collection whose edges name an unknown graph",
         {"g/graphs.csv": "graph,label\ng1,0\ng2,1\n", "g/edges.csv": "graph,source,target\ng1,a,b\ng9,a,b\n"},
         refused=r"edges\.csv: line 3 names graph 'g9', which .*graphs\.csv does not list"),
    Case("a collection without a label column",
         {"g/graphs.csv": "graph\ng1\ng2\n", "g/edges.csv": "graph,source,target\ng1,a,b\ng2,a,b\n"},
         refused=r"graphs\.csv: .*label"),
    Case("a collection with a ragged edge row",
         {"g/graphs.csv": "graph,label\ng1,0\ng2,1\n", "g/edges.csv": "graph,source,target\ng1,a,b\ng2,a\n"},
         refused=r"edges\.csv: line 3 has 2 fields; valid: 3 fields like the header"),
    Case("a collection", {"g/graphs.csv": "graph,label\ng1,0\ng2,1\n",
                          "g/edges.csv": "graph,source,target\ng1,a,b\ng1,b,c\ng2,a,b\n"},
         check=lambda g: g.num_graphs == 2),
    Case("an .npz whose labels are one short", {"g.npz": npz_bytes(edge_index=np.array([[0, 1], [1, 2]]),
                                                                   x=np.ones((3, 2)), y=np.array([0, 1]))},
         target="g.npz", refused=r"g\.npz: node counts disagree"),
    Case("an .npz with float node IDs", {"g.npz": npz_bytes(edge_index=np.array([[0], [1]]), node_ids=np.array([0.5, 1.5]))},
         target="g.npz", refused=r"g\.npz: node_ids of type float64"),
    # -- files and folders
    Case("a symlink loop as the dataset", {"g": symlink_loop("g")},
         refused=r"g: a symbolic link that leads nowhere \(a loop or a missing target\)"),
    Case("a symlink loop as edges.csv", {**folder(NODES), "g/edges.csv": symlink_loop("g/edges.csv")},
         refused=r"edges\.csv: a symbolic link that leads nowhere"),
    Case("a dangling symlink as nodes.csv", {"g/edges.csv": "\n".join(EDGES) + "\n",
                                             "g/nodes.csv": lambda root: os.symlink("missing.csv", root / "g/nodes.csv")},
         refused=r"nodes\.csv: a symbolic link that leads nowhere"),
    Case("a folder without graph files", {"g/readme.txt": "hello\n"}, refused=r"g: unknown format"),
    Case("a path that does not exist", {}, refused=r"g: no such file or directory"),
    Case("a directory named like a file", {"g/x.csv/keep": ""}, target="g/x.csv", refused=r"x\.csv"),
    Case("binary garbage as edges.csv", {"g/edges.csv": bytes(range(256)) * 4}, refused=r"edges\.csv"),
    Case("a truncated .csv.gz", {"g.csv.gz": gzip.compress(b"source,target\na,b\nb,c\n")[:-9]}, target="g.csv.gz",
         refused=r"g\.csv\.gz"),
    Case("a .csv.gz that is not gzip", {"g.csv.gz": b"source,target\na,b\n"}, target="g.csv.gz",
         refused=r"g\.csv\.gz: not a UTF-8 text file|g\.csv\.gz"),
    Case("a .csv.gz that expands 1,000 times", {"g.csv.gz": gz_bomb()}, target="g.csv.gz",
         refused=r"g\.csv\.gz: expands past 67 MB, over \d+ times its \d+ kB on disk; valid: a file that expands at "
                 r"most 100 times"),
    Case("a .csv.gz that expands little", {"g.csv.gz": gzip.compress(("\n".join(EDGES) + "\n").encode())},
         target="g.csv.gz", check=edges_of(5)),
    # -- .npz
    Case("an .npz", {"g.npz": npz_bytes(edge_index=np.array([[0, 1], [1, 2]]), x=np.ones((3, 2)))}, target="g.npz",
         check=edges_of(2)),
    Case("a pickle inside an .npz (an object array)", {"g.npz": npz_bytes(edge_index=np.array([[0], [1]]),
                                                                          y=np.array([{"a": 1}, None], dtype=object))},
         target="g.npz", refused=r"g\.npz: array 'y' holds Python objects"),
    Case("a pickle inside an .npz (a raw member)", {"g.npz": npz_with_member("x", pickle.dumps({"x": 1}))},
         target="g.npz", refused=r"g\.npz: member 'x' is not a numpy array \(\.npy\)"),
    Case("an .npz that expands 1,000 times", {"g.npz": npz_bomb()}, target="g.npz",
         refused=r"g\.npz: member 'x\.npy' expands to 70 MB, [\d,]+ times its \d+ kB on disk; valid: "),
    Case("an .npz with an unknown array", {"g.npz": npz_bytes(edges=np.array([[0], [1]]))}, target="g.npz",
         refused=r"g\.npz: unknown array 'edges'"),
    Case("an .npz with an edge_index of floats", {"g.npz": npz_bytes(edge_index=np.array([[0.5], [1.0]]))},
         target="g.npz", refused=r"edge_index of shape \(2, 1\) and type float64"),
    Case("an .npz with an edge beyond the nodes", {"g.npz": npz_bytes(edge_index=np.array([[0], [9]]),
                                                                      x=np.ones((3, 2)))},
         target="g.npz", refused=r"g\.npz"),
    Case("an .npz of NaN features", {"g.npz": npz_bytes(edge_index=np.array([[0], [1]]),
                                                        x=np.array([[1.0], [np.nan]]))}, target="g.npz",
         refused=r"g\.npz: .*x.*(NaN|nan|finite)"),
    Case("an .npz of huge features", {"g.npz": npz_bytes(edge_index=np.array([[0], [1]]), x=np.array([[1.0], [1e300]]))},
         target="g.npz", refused=r"g\.npz: x row 1, column 0 is 1e\+300, out of range"),
    Case("a .npy instead of an .npz", {"g.npz": npz_member(np.ones(3))}, target="g.npz",
         refused=r"g\.npz: a single \.npy array"),
    Case("a text file named .npz", {"g.npz": b"source,target\n"}, target="g.npz",
         refused=r"g\.npz: not an \.npz archive \(neither a zip of \.npy arrays nor one \.npy array; a pickle is never "
                 r"read\)"),
    # -- other formats
    Case("a pickle named .pt", {"g.pt": pickle.dumps({"edge_index": [[0], [1]]})}, target="g.pt",
         refused=r"g\.pt is not a PyG Data \(a pickle of other Python objects: Unsupported operand \d+, which "
                 r"weights-only loading refuses\)"),
    Case("an unknown suffix", {"g.xlsx": b"PK\x03\x04"}, target="g.xlsx", refused=r"g\.xlsx: unknown format"),
    Case("a .mat that is text", {"g.mat": b"not matlab"}, target="g.mat", refused=r"g\.mat"),
]


def write(root: Path, files: dict) -> None:
    for name, content in files.items():
        if callable(content):
            content(root)
            continue
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content, encoding="utf-8")


def outcome(case: Case, root: Path) -> str | None:
    """What is wrong with ``case``'s outcome, or None when it is the right one."""
    write(root, case.files)
    try:
        graph = read_graph(root / case.target, **(case.options or {}))
    except ConfigError as err:
        text = str(err)
        if case.refused is None:
            return f"refused, expected read: {text}"
        if "\n" in text:
            return f"refused in more than one line: {text!r}"
        return None if re.search(case.refused, text) else f"refused as {text!r}, expected /{case.refused}/"
    except Exception as err:  # a traceback for the user: always wrong
        return f"{type(err).__name__}: {err}"
    if case.refused is not None:
        return f"read ({graph.num_nodes} rows), expected refused /{case.refused}/"
    try:
        case.check(graph)
    except AssertionError as err:
        return f"read wrongly: {err}"
    return None


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_each_input_gives_its_outcome(case, tmp_path):
    wrong = outcome(case, tmp_path)
    assert wrong is None, wrong


def main() -> int:
    """``python tests/test_input_corpus.py``: every case's outcome and the count."""
    import tempfile

    wrong = 0
    for case in CASES:
        with tempfile.TemporaryDirectory() as tmp:
            problem = outcome(case, Path(tmp))
        wrong += problem is not None
        print(f"{'WRONG' if problem else 'right'}  {case.name}" + (f": {problem}" if problem else ""))
    refused = sum(c.refused is not None for c in CASES)
    print(f"{len(CASES)} inputs ({refused} to refuse, {len(CASES) - refused} to read): {len(CASES) - wrong} right, "
          f"{wrong} wrong")
    return 1 if wrong else 0


if __name__ == "__main__":
    raise SystemExit(main())
