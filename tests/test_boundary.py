"""Boundary edges of node splits and the boundary links (fedgraphcore.data.boundary, fedgraphcore.protocols.boundary,
clients/boundary.py, strategies/links.py), and fedspectral-plus on node splits, which uses them."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp

from app.api import cluster
from fedgraphcore.clustering import spectral_graph
from fedgraphcore.config import ConfigError
from fedgraphcore.data import load_dataset
from fedgraphcore.data.boundary import pool
from fedgraphcore.data.formats import read_graph
from fedgraphcore.data.assemble import DataFileError
from fedgraphcore.data.partition import partition
from fedgraphcore.data.shards import shard_from_arrays, shard_to_arrays
from fedgraphcore.data.types import Boundary, GraphData
from app.inprocess import InProcessGrid
from app.client_app import build_client_app
from fedgraphcore.privacy.secagg import FixedPointEncoder, SecAggParty, sum_masked
from fedgraphcore.protocols import boundary
from app.server_app import run_server
from fedgraphcore.transport import unpack


@pytest.fixture(scope="module")
def sbm():
    return load_dataset("sbm", seed=3)


def _pieces(data, shards):
    """Each shard as a party's piece: its nodes (keyed by global id), edges and boundary edges."""
    return [GraphData(f"p{s.client_id}", s.adj, s.x, s.y, {}, s.node_ids, s.boundary) for s in shards]


# -- the split ------------------------------------------------------------------------------


def test_every_cut_edge_is_a_boundary_edge_of_both_its_ends(sbm):
    shards = partition(sbm, "node-random", 4, seed=1)
    owner = np.empty(sbm.num_nodes, dtype=np.int64)
    for s in shards:
        owner[s.node_ids] = s.client_id
    listed = {}
    for s in shards:
        for row, key, w in zip(s.boundary.rows, s.boundary.keys, s.boundary.weight):
            i, j = int(s.node_ids[row]), int(key)
            assert owner[i] == s.client_id != owner[j]
            listed[(i, j)] = w
    coo = sp.coo_matrix(sbm.adj)
    cut = {(int(i), int(j)) for i, j in zip(coo.row, coo.col) if owner[i] != owner[j]}
    assert set(listed) == cut and len(cut) > 0  # each direction once: from each end's client
    inner = sum(s.num_edges for s in shards)
    assert inner + len(cut) // 2 == sbm.num_edges


def test_boundary_false_drops_the_cut_edges(sbm):
    shards = partition(sbm, "node-random", 3, seed=1, boundary=False)
    assert all(s.boundary is None for s in shards)
    with pytest.raises(ConfigError, match="partition.boundary"):
        partition(sbm, "node-random", 3, boundary="maybe")


def test_the_pieces_pool_into_the_whole_graph_every_edge_once(sbm):
    shards = partition(sbm, "node-community", 3, seed=2)
    whole = pool(_pieces(sbm, shards))
    order = whole.node_keys
    assert sorted(order.tolist()) == list(range(sbm.num_nodes))
    assert (whole.adj != sbm.adj[order][:, order]).nnz == 0
    assert np.array_equal(whole.y, sbm.y[order])


def test_a_cut_edge_listed_by_one_side_only_is_refused(sbm):
    shards = partition(sbm, "node-random", 2, seed=1)
    b = shards[0].boundary
    shards[0].boundary = Boundary(b.rows[1:], b.keys[1:], b.weight[1:])
    with pytest.raises(ValueError, match="only one of its two pieces"):
        pool(_pieces(sbm, shards))


def test_shard_files_keep_the_boundary(sbm):
    shard = partition(sbm, "node-random", 3, seed=1)[2]
    back, _ = shard_from_arrays(shard_to_arrays(shard))
    for field in ("rows", "keys", "weight"):
        assert np.array_equal(getattr(back.boundary, field), getattr(shard.boundary, field))


# -- a party's files --------------------------------------------------------------------------


def _party_files(tmp_path, name, nodes, edges):
    (tmp_path / f"{name}_nodes.csv").write_text("id,f,label\n" + "".join(f"{i},{i / 10},{i % 2}\n" for i in nodes))
    (tmp_path / f"{name}_edges.csv").write_text("source,target\n" + "".join(f"{a},{b}\n" for a, b in edges))
    return tmp_path / f"{name}_edges.csv", tmp_path / f"{name}_nodes.csv"


def test_an_edge_list_names_another_partys_nodes_as_boundary_edges(tmp_path):
    edges, nodes = _party_files(tmp_path, "a", [3, 1, 2], [(1, 2), (2, 3), (3, 10), (11, 1), (1, 11)])
    piece = read_graph(edges, node_table=nodes, boundary=True)
    assert piece.keys.tolist() == [1, 2, 3] and piece.num_edges == 2
    assert sorted(zip(piece.boundary.rows.tolist(), piece.boundary.keys.tolist())) == [(0, 11), (2, 10)]
    with pytest.raises(DataFileError, match="line 4 names node 10, which .* does not list"):
        read_graph(edges, node_table=nodes)  # a whole graph: an unknown ID is an error


def test_a_node_whose_only_edges_reach_other_parties_is_not_noted_isolated(tmp_path):
    edges, nodes = _party_files(tmp_path, "a", [1, 2, 3, 4], [(1, 2), (3, 10)])
    notes = read_graph(edges, node_table=nodes, boundary=True).meta["notes"]
    assert any("1 isolated node(s) kept" in n and "first: 4" in n for n in notes), notes


def test_an_edge_with_neither_end_in_the_node_table_is_refused_with_its_line(tmp_path):
    edges, nodes = _party_files(tmp_path, "a", [1, 2], [(1, 2), (10, 11)])
    with pytest.raises(DataFileError, match=r"line 3 joins nodes 10 and 11, neither of which"):
        read_graph(edges, node_table=nodes, boundary=True)


def test_a_boundary_edge_with_two_weights_is_refused(tmp_path):
    (tmp_path / "n.csv").write_text("id,f\n1,0.5\n")
    (tmp_path / "e.csv").write_text("source,target,weight\n1,7,2\n7,1,3\n")
    with pytest.raises(DataFileError, match="weight"):
        read_graph(tmp_path / "e.csv", node_table=tmp_path / "n.csv", boundary=True)


def test_data_check_counts_a_partys_boundary_edges(tmp_path):
    from fedgraphcore.data.check import run

    edges, _ = _party_files(tmp_path, "a", [1, 2, 3], [(1, 2), (2, 3), (3, 10), (1, 11)])
    lines = run([str(edges), "--partitioner", "node-random", "--read", f"node-table={tmp_path / 'a_nodes.csv'}"])
    assert any("boundary edges: 2 to 2 node(s)" in line for line in lines)


# -- the links and the products, without Flower -----------------------------------------------


def _linked(sbm, clients=3):
    shards = partition(sbm, "node-random", clients, seed=4)
    key = boundary.group_key([bytes([c]) * boundary.SHARE_BYTES for c in range(clients)])
    directory = np.concatenate([boundary.tags(key, s.node_ids) for s in shards])
    offsets = np.concatenate([[0], np.cumsum([s.num_nodes for s in shards])[:-1]])
    links = [boundary.link(directory, s.boundary, key, int(o), boundary.tags(key, s.node_ids))
             for s, o in zip(shards, offsets)]
    order = np.concatenate([s.node_ids for s in shards])  # position -> global node id
    return shards, links, order


def test_the_column_blocks_add_up_to_the_whole_adjacency(sbm):
    shards, links, order = _linked(sbm)
    whole = sum(boundary.column_block(s.adj, s.boundary, ln).toarray() @ np.eye(s.num_nodes, len(order), ln.offset)
                for s, ln in zip(shards, links))
    assert np.array_equal(whole, sbm.adj[order][:, order].toarray())
    for s, ln in zip(shards, links):
        assert np.array_equal(boundary.degrees(s.adj, s.boundary), np.asarray(sbm.adj.sum(1)).ravel()[s.node_ids])


def test_a_boundary_edge_to_an_id_no_party_holds_is_refused(sbm):
    shards, links, _ = _linked(sbm)
    s = shards[0]
    key = boundary.group_key([bytes([c]) * boundary.SHARE_BYTES for c in range(3)])
    directory = np.concatenate([boundary.tags(key, t.node_ids) for t in shards])
    stray = Boundary(np.array([0]), np.array([10**9]), np.array([1.0]))
    with pytest.raises(ValueError, match="1 boundary edge.*no party holds") as err:
        boundary.link(directory, stray, key, 0, boundary.tags(key, s.node_ids))
    assert str(10**9) not in str(err.value)  # the message may travel: no ID in it


def test_a_party_refuses_a_directory_that_puts_its_rows_and_pad_elsewhere(sbm):
    """A server that told party 1 it starts where party 0 does would find party 1's own positions
    unpadded in the next padded sum: the other parties' terms for party 1's nodes, in clear."""
    shards, links, _ = _linked(sbm)
    key = boundary.group_key([bytes([c]) * boundary.SHARE_BYTES for c in range(3)])
    directory = np.concatenate([boundary.tags(key, t.node_ids) for t in shards])
    own = boundary.tags(key, shards[1].node_ids)
    with pytest.raises(ValueError, match="does not hold this party's rows at offset 0"):
        boundary.link(directory, shards[1].boundary, key, 0, own)
    doubled = np.concatenate([directory, own[:1]])
    with pytest.raises(ValueError, match="a tag twice"):
        boundary.link(doubled, shards[1].boundary, key, links[1].offset, own)


def test_tags_depend_on_the_group_key_and_read_an_id_as_text():
    a, b = boundary.group_key([b"\x01" * 32]), boundary.group_key([b"\x02" * 32])
    assert np.array_equal(boundary.tags(a, np.array([7])), boundary.tags(a, np.array(["7"])))
    assert not np.array_equal(boundary.tags(a, np.array([7])), boundary.tags(b, np.array([7])))


def _parties(count):
    parties = [SecAggParty.generate(i, "t") for i in range(count)]
    keys = {p.party_id: p.public_key_bytes() for p in parties}
    for p in parties:
        p.agree(keys)
    return parties


def test_a_padded_sum_hands_each_owner_its_neighbour_sums_and_the_server_a_uniform_ring_sum(sbm):
    shards, links, order = _linked(sbm)
    parties = _parties(3)
    rng = np.random.default_rng(0)
    h = rng.standard_normal((sbm.num_nodes, 3))  # by global id; each party holds its own rows
    encoder = FixedPointEncoder(2.0**20, 1e4, 3)
    uploads = []
    for s, ln, party in zip(shards, links, parties):
        product = boundary.column_block(s.adj, s.boundary, ln) @ h[s.node_ids]
        masked = party.mask(product, "hop", encoder)
        uploads.append(boundary.pad_rows(masked, party.pad("hop", s.num_nodes * 3, masked.dtype), ln))
    ring = sum_masked(uploads)
    whole = sbm.adj @ h
    for s, ln, party in zip(shards, links, parties):
        rows = boundary.slice_rows(ring, ln.offset, s.num_nodes)
        mine = encoder.decode(boundary.unpad_rows(rows, party.pad("hop", rows.size, rows.dtype)))
        assert np.allclose(mine, whole[s.node_ids], atol=1e-5)
        # what the server holds for these rows is the pad's, not the sum's: far beyond any honest sum
        assert np.abs(encoder.decode(rows)).max() > 100 * np.abs(whole).max()
    assert np.allclose(encoder.decode(ring), np.zeros_like(whole), atol=1e-5) is False


def test_a_sealed_share_opens_only_for_its_receiver_and_use():
    a, b, c = _parties(3)
    sealed = a.seal(1, b"\x07" * 32, boundary.share_label(0, 1))
    assert b.unseal(0, sealed, boundary.share_label(0, 1)) == b"\x07" * 32
    with pytest.raises(Exception, match="authentication"):
        c.unseal(0, sealed, boundary.share_label(0, 1))
    with pytest.raises(Exception, match="authentication"):
        b.unseal(0, sealed, boundary.share_label(0, 2))


# -- fedspectral-plus on node splits, end to end -------------------------------------------


def _raw(**keys):
    return {"strategy": "fedspectral-plus", "dataset": "sbm", "seed": 3, "partitioner": "node-random",
            "num-clusters": 4, "reference": True, **keys}


def test_fedspectral_plus_on_a_node_split_gives_the_centralised_labels(tmp_path):
    raw = {**_raw(), "num-clients": 3, "out-dir": str(tmp_path)}
    grid = InProcessGrid(build_client_app(raw), 3, record=True)
    result = run_server(grid, raw)
    assert result["reference"]["agreement"]["ari"] == 1.0
    assert result["metrics"]["protocol_rounds"] > 1
    # what reached the server: tags (16 bytes a row, no ID), masked blocks and degrees
    for reply in grid.pulled:
        arrays = unpack(reply.content)[0]
        action = reply.metadata.message_type.split(".", 1)[1]
        if action == boundary.BOUNDARY_TAGS:
            assert arrays["tags"].dtype == np.uint8 and arrays["tags"].shape[1] == boundary.TAG_BYTES
        if action in ("fedspectral_product", "fedspectral_degrees"):
            assert all(a.dtype.kind == "u" for a in arrays.values())
    uploads = {(u["action"], u["name"]): u for u in result["privacy"]["uploads"]}
    assert uploads[("fedspectral_product", "block")]["masked"]


def test_fedspectral_plus_with_one_client_on_a_node_split_is_the_centralised_algorithm(tmp_path):
    data = load_dataset("sbm", seed=3)
    result = cluster("fedspectral-plus", data, 1, config={"partitioner": "node-random", "num-clusters": 4})
    assert np.array_equal(result.labels, spectral_graph(data.adj, 4, 0, n_init=0))  # the default restarts


def test_fedspectral_plus_on_parties_pieces_with_boundary_edges_equals_the_pooled_reference():
    data = load_dataset("sbm", seed=5)
    pieces = _pieces(data, partition(data, "node-community", 3, seed=0))
    result = cluster("fedspectral-plus", pieces, config={"partitioner": "node-random", "num-clusters": 4})
    whole = pool(pieces)
    reference = spectral_graph(whole.adj, 4, 0, n_init=0)
    assert np.array_equal(result.ids, whole.keys)
    from fedgraphcore.metrics import agreement

    assert agreement(reference, result.labels)["ari"] == 1.0


def test_a_partys_edge_to_an_id_no_party_holds_stops_the_run_with_the_rule():
    data = load_dataset("sbm", seed=5)
    pieces = _pieces(data, partition(data, "node-random", 3, seed=0))
    b = pieces[1].boundary
    pieces[1].boundary = Boundary(np.append(b.rows, 0), np.append(b.keys, 10**6), np.append(b.weight, 1.0))
    with pytest.raises(Exception, match="rule 'boundary edges to nodes some party holds'") as err:
        cluster("fedspectral-plus", pieces, config={"partitioner": "node-random", "num-clusters": 4})
    assert "\n" not in str(err.value).strip() and str(10**6) not in str(err.value)


@pytest.mark.parametrize("keys, message", [
    ({"partition.boundary": False}, "needs partition.boundary=true"),
    ({"fedspectral-plus.mode": "paper"}, "fedspectral-plus.mode=exact"),
    ({"partition.overlap": 0.2}, "partition.overlap=0"),
])
def test_fedspectral_plus_refuses_a_node_split_it_cannot_use(keys, message):
    from app.run import run_experiment

    with pytest.raises(ConfigError, match=message):
        run_experiment("fedspectral-plus", "sbm", 3, {"partitioner": "node-random", **keys}, None, "inprocess")
