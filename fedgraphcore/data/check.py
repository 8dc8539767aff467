"""Check a party's own data before it joins a federation, and say what it will hold.

    python -m app.data.check PATH --partitioner vertical [--set KEY=VALUE ...] [--read OPTION=VALUE ...]

``PATH`` is what the party's SuperNode gets as node config ``data`` (a file or
a directory in one of the formats of :mod:`fedgraphcore.data.formats`); ``--read``
passes the reader options (node config ``read.OPTION``), ``--set`` the data
run-config keys the split reads (``partition.replicas``, ``khop.hops``, ...).
It reads the data exactly as the SuperNode will (:func:`fedgraphcore.data.parties.party_node_shard`)
and prints the rows, feature columns, edges or graphs, whether labels are
present, notes such as isolated nodes, and for the splits in which every party
must hold the same nodes (edge, vertical) the node-set digest the parties can
compare beforehand. Nothing is sent anywhere. A bad file or option: one line on
stderr and exit code 2.
"""

from __future__ import annotations

import sys
from typing import Any, Mapping

import numpy as np

from fedgraphcore.config import ArgumentParser, ConfigError, exit_code, parse_assignments

from .boundary import count
from .params import DATA_PARAMS, SEED
from .parties import DATA_KEY, FAMILY, SHARED_NODES, family, node_set_digest, party_node_shard
from .prepare import parse_data_sets
from .types import Shard

#: What a party holds in each split family (what its client may use).
HOLDS = {
    "node": "its nodes (rows), their features and labels, and the edges among them",
    "khop": "its nodes and the edges among them; one k-hop subgraph around each centre",
    "edge": "its edges over the node IDs every party holds (no features unless partition.with-features)",
    "vertical": "its feature columns of the node IDs every party holds, and the shared graph",
    "graphs": "its graphs and their graph labels",
}


def _ids(keys: np.ndarray) -> str:
    return "integer IDs" if keys.dtype.kind in "iu" else "text IDs"


def _labels(y) -> str:
    if y is None:
        return "no labels"
    known = y[y >= 0]
    missing = f", {y.size - known.size} unlabelled" if known.size < y.size else ""
    return f"labels: {np.unique(known).size} classes{missing}"


def describe(shard: Shard, piece) -> list[str]:
    """Lines saying what the party holding ``shard`` (read from ``piece``) will hold."""
    kind = family(shard.partitioner)
    if kind == "graphs":
        nodes = sum(g.num_nodes for g in shard.graphs)
        edges = sum(g.num_edges for g in shard.graphs)
        width = {g.num_features for g in shard.graphs}
        lines = [f"{shard.num_graphs} graphs ({_ids(shard.keys)}), {nodes} nodes, {edges} edges, "
                 f"feature columns: {'/'.join(map(str, sorted(width))) or 0}, graph {_labels(shard.graph_y)}"]
    else:
        features = 0 if piece.x is None else int(piece.x.shape[1])
        lines = [f"{piece.num_nodes} nodes ({_ids(shard.keys)}), {piece.num_edges} edges, {features} feature columns, "
                 f"{_labels(piece.y)}"]
        if shard.boundary is not None:
            edges, reached = count(shard.boundary)
            lines.append(f"boundary edges: {edges} to {reached} node(s) its node table does not list (another "
                         "party's nodes; an ID no party holds stops the run at its start)")
        if kind == "khop":
            sizes = [g.num_nodes for g in shard.graphs]
            lines.append(f"k-hop subgraphs: {len(sizes)} centres, {min(sizes)}..{max(sizes)} nodes each")
    lines += [f"note: {note}" for note in piece.meta.get("notes", [])]  # the reader's repairs and findings
    holds = HOLDS[kind] + (" and to other parties' nodes (boundary edges)" if shard.boundary is not None else "")
    lines.append(f"split '{shard.partitioner}' ({kind}): this party holds {holds}")
    if kind in SHARED_NODES:
        lines.append(f"node-set digest (every party must show the same): {node_set_digest(shard.keys)}")
    return lines


def check_party(path: str, values: Mapping[str, Any], options: Mapping[str, Any] | None = None) -> list[str]:
    """Read the party data at ``path`` as its SuperNode will, for the run-config ``values``
    (partitioner, seed, partition keys); return :func:`describe`'s lines. ConfigError (one
    line) on a file or option the split cannot use."""
    from .parties import load_piece, read_options, reads_boundary

    node_config = {DATA_KEY: path, **{f"read.{k}": v for k, v in (options or {}).items()}}
    shard = party_node_shard(values, node_config, 0, 1)
    return describe(shard, load_piece(path, read_options(node_config), reads_boundary(values)))


def _parser() -> ArgumentParser:
    p = ArgumentParser(prog="python -m app.data.check", description=__doc__.splitlines()[0])
    p.add_argument("path", help="the party's data: a file or a directory")
    p.add_argument("--partitioner", default=None, help="the run's split (required): one of " + ", ".join(FAMILY))
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="data run-config key, e.g. khop.hops=1 (repeatable)")
    p.add_argument("--read", action="append", default=[], metavar="OPTION=VALUE",
                   help="reader option, as node config read.OPTION (repeatable)")
    return p


def run(argv: list[str] | None = None) -> list[str]:
    args = _parser().parse_args(argv)
    if args.partitioner is None:
        raise ConfigError(f"{args.path}: which split is this party's data part of? valid: --partitioner with one of "
                          + ", ".join(FAMILY) + " (the run's partitioner)")
    family(args.partitioner)
    values: dict[str, Any] = {**{p.key: p.default for p in DATA_PARAMS}, **parse_data_sets(args.set),
                              "partitioner": args.partitioner, "seed": SEED.coerce(args.seed)}
    lines = check_party(args.path, values, parse_assignments(args.read))
    print(f"{args.path}:")
    for line in lines:
        print(f"  {line}")
    return lines


def main(argv: list[str] | None = None) -> int:
    return exit_code(run, argv)


if __name__ == "__main__":
    sys.exit(main())
