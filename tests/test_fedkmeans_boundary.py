"""fedkmeans on a node split with boundary edges: the AGC filter runs over the whole graph across
the parties (padded secure sums), so every party's rows are its nodes' rows of the centralised
filtered features; then the federated Lloyd protocol as before."""

from __future__ import annotations

import numpy as np
import pytest

from app.client_app import build_client_app
from fedgraphcore.data import load_dataset
from fedgraphcore.data.partition import partition
from fedgraphcore.graph_filters import low_pass_filter
from app.inprocess import InProcessGrid
from fedgraphcore.privacy.policy import MIN_ROWS
from fedgraphcore.privacy.secagg import FixedPointEncoder, sum_masked
from fedgraphcore.protocols import boundary
from fedgraphcore.protocols import fedkmeans
from fedgraphcore.protocols.boundary import PADDED_ROWS
from app.server_app import run_server
from fedgraphcore.session import PrivacyRefused, ServerSession
from fedgraphcore.transport import pack, unpack
from fedgraphcore.wire import ProtocolError
from clients.fedkmeans import FILTERED, FedKMeansClient

N, K, F = 240, 4, 8
SBM = {"sbm.nodes": N, "sbm.blocks": K, "sbm.features": F, "sbm.signal": 3.0, "sbm.p-in": 0.1, "sbm.p-out": 0.01}


def sbm(seed: int = 0):
    return load_dataset("sbm", seed=seed, nodes=N, blocks=K, features=F, signal=3.0, p_in=0.1, p_out=0.01)


def run(out_dir, clients: int, order: int, **extra) -> tuple[InProcessGrid, dict]:
    raw = {**SBM, "strategy": "fedkmeans", "dataset": "sbm", "num-clients": clients, "fedkmeans.restarts": 1,
           "fedkmeans.filter-order": order, "out-dir": str(out_dir), **extra}
    grid = InProcessGrid(build_client_app(raw), clients, record=True)
    return grid, run_server(grid, raw)


def replies(grid: InProcessGrid, action: str) -> list:
    return [r for r in grid.pulled if r.metadata.message_type == f"query.{action}"]


def requests(grid: InProcessGrid, action: str) -> list:
    return [m for m in grid.pushed if m.metadata.message_type == f"query.{action}"]


def client_rows(grid: InProcessGrid) -> dict[int, tuple[np.ndarray, dict]]:
    """Each node's global row ids (its kmeans_assign reply) and its kept state."""
    return {r.metadata.src_node_id: (unpack(r.content)[0]["node_ids"], grid.contexts[r.metadata.src_node_id].state)
            for r in replies(grid, fedkmeans.KMEANS_ASSIGN)}


def protocol_labels(parts: list[np.ndarray], k: int, seed: int, rounds: int, tol: float,
                    min_rows: int) -> list[np.ndarray]:
    """The fedkmeans protocol's math on one machine, one start: each part's local seeds, merged, Lloyd sums
    over the parts (in partition order, as the server adds them), each part's final labels."""
    seeds = [fedkmeans.local_seeds(x, k, seed, min_rows) for x in parts]
    audits = [fedkmeans.Audit.of_seeds(labels, len(c), min_rows) if min_rows > 1 else None for c, _, labels in seeds]
    centres = fedkmeans.merge_seeds(np.vstack([s[0] for s in seeds]), np.concatenate([s[1] for s in seeds]), k, seed)
    for _ in range(rounds):
        total = 0
        for i, x in enumerate(parts):
            sums, counts, withheld, inertia, audits[i] = fedkmeans.lloyd_statistics(x, centres, min_rows, audits[i])
            total = total + fedkmeans.join_statistics(sums, counts, withheld, inertia)
        sums, counts, _, _ = fedkmeans.split_statistics(total, k)
        new = fedkmeans.update_centres(centres, sums, counts)
        shift, centres = float(np.abs(new - centres).max()), new
        if shift <= tol:
            break
    return [fedkmeans.assign(x, centres)[0] for x in parts]


# --------------------------------------------------------------------------- protocol math
def test_hops_over_column_blocks_give_the_pooled_filter():
    """Plain functions: B_c U_c summed over the parties is A U; filter_hop on each party's rows
    then gives its rows of G F, hop after hop, and every party's term stays within hop_bound."""
    data = sbm()
    shards = partition(data, "node-random", 3, seed=0)
    order_of = np.concatenate([s.node_ids for s in shards])  # positions: parties' rows end to end
    offsets = np.concatenate([[0], np.cumsum([s.num_nodes for s in shards])])
    position = np.argsort(order_of)
    links = [boundary.Links(int(offsets[c]), N, position[s.boundary.keys.astype(np.int64)])
             for c, s in enumerate(shards)]
    blocks = [boundary.column_block(s.adj, s.boundary, link) for s, link in zip(shards, links)]
    degrees = [boundary.degrees(s.adj, s.boundary) for s in shards]
    rows = [np.asarray(s.x, dtype=np.float64) for s in shards]
    for order in range(1, 5):
        terms = [b @ fedkmeans.scaled_rows(f, d) for b, f, d in zip(blocks, rows, degrees)]
        assert max(np.abs(t).max() for t in terms) <= fedkmeans.hop_bound(N, np.abs(data.x).max())
        total = sum(terms)
        rows = [fedkmeans.filter_hop(f, total[offsets[c]:offsets[c + 1]], d) for c, (f, d) in enumerate(zip(rows, degrees))]
        pooled = low_pass_filter(data.x, data.adj, order)[order_of]
        assert np.abs(np.vstack(rows) - pooled).max() <= 1e-12 * np.abs(pooled).max()


# --------------------------------------------------------------------------- end to end
def test_federated_filter_equals_the_centralised_filter_and_the_server_sees_padded_sums(out_dir):
    order, clients = 3, 3
    grid, result = run(out_dir, clients, order)
    data = sbm()
    centralised = low_pass_filter(data.x, data.adj, order)
    kept = client_rows(grid)
    assert len(kept) == clients
    for ids, state in kept.values():
        assert int(state.array_records[FILTERED]["hops"].numpy()[0]) == order
        rows = state.array_records[FILTERED]["rows"].numpy()
        assert np.abs(rows - centralised[ids]).max() <= 1e-6 * np.abs(centralised).max()
    assert result["reference"]["agreement"]["ari"] >= 0.99
    # hello carries no centres: the seeds come after the filter, with kmeans_init
    assert not any(unpack(r.content)[0] for r in replies(grid, "hello"))
    assert len(replies(grid, fedkmeans.KMEANS_INIT)) == clients
    # one round per hop; the rows of hop t ride down with hop t + 1's request, the last with init
    hops = {m.metadata.message_id: unpack(m.content) for m in requests(grid, fedkmeans.KMEANS_FILTER)}
    assert sorted(int(v["hop"]) for _, v in hops.values()) == sorted(list(range(1, order + 1)) * clients)
    assert all((PADDED_ROWS in a) == (int(v["hop"]) > 1) for a, v in hops.values())
    assert all(PADDED_ROWS in unpack(m.content)[0] for m in requests(grid, fedkmeans.KMEANS_INIT))
    # the server receives masked ring arrays (N x f) whose ring sum is padded: not A D~^-1/2 X
    first = [r for r in replies(grid, fedkmeans.KMEANS_FILTER) if int(hops[r.metadata.reply_to_message_id][1]["hop"]) == 1]
    uploads = [unpack(r.content)[0][fedkmeans.NEIGHBOURS] for r in first]
    assert len(uploads) == clients and all(u.dtype == np.uint64 and u.shape == (N, F) for u in uploads)
    values = next(v for _, v in hops.values() if int(v["hop"]) == 1)
    ring = FixedPointEncoder(values["secagg_scale"], values["secagg_bound"], values["secagg_parties"]) \
        .decode(sum_masked(uploads))
    partition_of = {n: grid.contexts[n].node_config["partition-id"] for n in kept}
    order_of = np.concatenate([kept[n][0] for n in sorted(kept, key=partition_of.get)])
    degrees = np.asarray(data.adj.sum(axis=1)).ravel()
    plain = (data.adj @ fedkmeans.scaled_rows(np.asarray(data.x, dtype=np.float64), degrees))[order_of]
    assert (np.abs(ring - plain) > 1.0).all()  # every entry padded, on every party's rows
    assert len(np.unique(np.concatenate(uploads).ravel() >> np.uint64(60))) == 16  # uniform-looking
    ledger = {m["name"]: m for m in result["privacy"]["mechanisms"]}
    assert "fedkmeans:whole-graph-filter" in ledger and f"padded-sum:{fedkmeans.NEIGHBOURS}" in ledger


@pytest.mark.parametrize("clients", [4, 5])
def test_agreement_with_the_centralised_reference_on_the_planted_partition(out_dir, clients):
    """The default sbm (1000 nodes) at a seed no other test uses: the labels agree with k-means on
    the pooled filtered features."""
    from app.run import run_experiment

    result = run_experiment("fedkmeans", "sbm", clients, {"fedkmeans.filter-order": 4, "seed": 7}, out_dir)
    assert result["reference"]["agreement"]["ari"] >= 0.99


def test_one_client_is_the_centralised_algorithm(out_dir):
    order = 2
    grid, _ = run(out_dir, 1, order, **{"partitioner": "node-random"})
    (ids, state), = client_rows(grid).values()
    data = sbm()
    assert FILTERED not in state.array_records  # one client holds the whole graph: it filters it locally
    shard, = partition(data, "node-random", 1, seed=0)
    assert np.array_equal(shard.node_ids, ids)
    x = fedkmeans.local_features(shard.x, shard.adj, fedkmeans.FedKMeansConfig(filter_order=order), 0)
    assert np.abs(x - low_pass_filter(data.x, data.adj, order)[ids]).max() <= 1e-12
    expected, = protocol_labels([x], K, 0, 20, 1e-6, MIN_ROWS)
    assert np.array_equal(state.array_records["labels"]["labels"].numpy(), expected)
    assert not requests(grid, fedkmeans.KMEANS_FILTER) and not requests(grid, "boundary_shares")


def test_without_boundary_edges_each_client_filters_its_own_subgraph(out_dir):
    """partition.boundary=false: the protocol as without boundary edges (local filter, seeds with
    hello, no links, nothing masked): labels are the protocol math's on the locally filtered rows."""
    order, clients = 2, 3
    grid, _ = run(out_dir, clients, order, **{"partition.boundary": False})
    assert not requests(grid, fedkmeans.KMEANS_FILTER) and not requests(grid, "boundary_shares")
    assert all(unpack(r.content)[0]["centres"].shape[1] == F for r in replies(grid, "hello"))
    shards = partition(sbm(), "node-random", clients, seed=0, boundary=False)
    parts = [fedkmeans.local_features(s.x, s.adj, fedkmeans.FedKMeansConfig(filter_order=order), 0) for s in shards]
    expected = protocol_labels(parts, K, 0, 20, 1e-6, MIN_ROWS)
    by_partition = {grid.contexts[n].node_config["partition-id"]: (ids, state) for n, (ids, state) in
                    client_rows(grid).items()}
    for c, shard in enumerate(shards):
        ids, state = by_partition[c]
        assert np.array_equal(ids, shard.node_ids) and FILTERED not in state.array_records
        assert np.array_equal(state.array_records["labels"]["labels"].numpy(), expected[c])


def test_a_hop_bound_below_the_honest_one_is_refused(out_dir, monkeypatch):
    """A server declaring a hop bound too small for the parties' entries (clipping would alter
    them; the party knows the honest bound from N and secagg.bound) is refused."""
    honest = ServerSession.secagg_values

    def low(self, name, bound, finest=False):
        return honest(self, name, bound / 1000 if name.startswith(fedkmeans.NEIGHBOURS) else bound, finest)

    monkeypatch.setattr(ServerSession, "secagg_values", low)
    with pytest.raises(PrivacyRefused, match="secagg-bound"):
        run(out_dir, 3, 2)


def test_a_hop_out_of_order_is_refused(out_dir, monkeypatch):
    """A party takes its filter one hop at a time: a server that skips hop 1 (asking for hop 2's
    upload without hop 1's sum) gets a refusal, not an upload of unfiltered rows labelled hop 2."""
    honest = ServerSession.exchange

    def skipping(self, action, contents, expect=None, **kw):
        if action == fedkmeans.KMEANS_FILTER:
            contents = {n: pack(a, {**v, "hop": int(v["hop"]) + 1}) for n, (a, v) in
                        ((n, unpack(c)) for n, c in contents.items())}
        return honest(self, action, contents, expect, **kw)

    monkeypatch.setattr(ServerSession, "exchange", skipping)
    with pytest.raises(ProtocolError, match="kmeans_filter.*ProtocolError"):
        run(out_dir, 3, 3)


def _labels(grid: InProcessGrid) -> dict[int, np.ndarray]:
    return {grid.contexts[n].node_config["partition-id"]: state.array_records["labels"]["labels"].numpy()
            for n, (_, state) in client_rows(grid).items()}


def test_a_graph_without_edges_is_not_filtered(out_dir):
    """No party holds an edge (iris on a node split with boundary edges), as hello tells the server:
    no links and no hops; ``kmeans_init`` asks for the seeds of the features as they are (0 hops, not
    projected), and the labels are exactly filter-order 0's."""
    raw = {"strategy": "fedkmeans", "dataset": "iris", "num-clients": 3, "fedkmeans.dims": 2}
    runs = {}
    for order in (4, 0):
        config = {**raw, "fedkmeans.filter-order": order, "out-dir": str(out_dir / str(order))}
        grid = InProcessGrid(build_client_app(config), 3, record=True)
        runs[order] = grid, run_server(grid, config)
    grid, result = runs[4]
    assert not requests(grid, fedkmeans.KMEANS_FILTER) and not requests(grid, "boundary_shares")
    assert [unpack(m.content)[1]["hops"] for m in requests(grid, fedkmeans.KMEANS_INIT)] == [0, 0, 0]
    assert all(unpack(r.content)[0]["centres"].shape[1] == 4 for r in replies(grid, fedkmeans.KMEANS_INIT))
    plain = _labels(runs[0][0])
    assert len(plain) == 3 and all(np.array_equal(a, plain[c]) for c, a in _labels(grid).items())
    assert result["reference"]["agreement"]["ari"] == runs[0][1]["reference"]["agreement"]["ari"]


def test_a_party_holding_an_edge_refuses_seeds_without_the_filter(out_dir, monkeypatch):
    """A server that skips the filter (every hello said no edge, but this party holds one) gets a
    refusal of ``kmeans_init`` with 0 hops, not the seeds of unfiltered rows."""
    monkeypatch.setattr(FedKMeansClient, "hello_figures", lambda self, values: {fedkmeans.HAS_EDGES: 0})
    with pytest.raises(ProtocolError, match="ProtocolError in step .kmeans_init"):
        run(out_dir, 3, 2)


# --------------------------------------------------------------------------- shared projection
DIMS = 4  # narrower than the F = 8 features: every party projects its rows first


def test_one_client_with_the_shared_projection_is_the_centralised_reference(out_dir):
    """One client: its rows are the pooled features times the seed's projection, filtered; its labels
    are the protocol's on them, and exactly the centralised reference's (which projects the same)."""
    order = 2
    grid, result = run(out_dir, 1, order, **{"partitioner": "node-random", "fedkmeans.dims": DIMS})
    (ids, state), = client_rows(grid).values()
    data = sbm()
    assert all(unpack(r.content)[0]["centres"].shape[1] == DIMS for r in replies(grid, "hello"))
    projection = fedkmeans.shared_projection(F, DIMS, 0)
    x = low_pass_filter(np.asarray(data.x, dtype=np.float64) @ projection, data.adj, order)[ids]
    expected, = protocol_labels([x], K, 0, 20, 1e-6, MIN_ROWS)
    assert np.array_equal(state.array_records["labels"]["labels"].numpy(), expected)
    assert result["reference"]["agreement"]["ari"] == 1.0


def test_the_filter_over_the_whole_graph_moves_the_projected_columns(out_dir):
    """Three parties: each hop uploads N x dims, and every party's rows are its nodes' rows of the
    centralised filter of the projected features (the reference's rows)."""
    order, clients = 2, 3
    grid, _ = run(out_dir, clients, order, **{"fedkmeans.dims": DIMS})
    assert all(unpack(r.content)[0][fedkmeans.NEIGHBOURS].shape == (N, DIMS) for r in replies(grid, fedkmeans.KMEANS_FILTER))
    data = sbm()
    pooled = low_pass_filter(np.asarray(data.x, dtype=np.float64) @ fedkmeans.shared_projection(F, DIMS, 0),
                             data.adj, order)
    for ids, state in client_rows(grid).values():
        assert np.abs(state.array_records[FILTERED]["rows"].numpy() - pooled[ids]).max() <= 1e-9
    assert all(unpack(r.content)[0]["centres"].shape[1] == DIMS for r in replies(grid, fedkmeans.KMEANS_INIT))


def test_the_projection_is_drawn_from_the_seed_alone():
    """Every party draws the same matrix from the run's seed, another from another seed; with
    filter-order 0 or features no wider than dims the rows are not projected."""
    assert np.array_equal(fedkmeans.shared_projection(F, DIMS, 1), fedkmeans.shared_projection(F, DIMS, 1))
    assert not np.array_equal(fedkmeans.shared_projection(F, DIMS, 1), fedkmeans.shared_projection(F, DIMS, 2))
    x = np.arange(2.0 * F).reshape(2, F)
    assert fedkmeans.projected(x, fedkmeans.FedKMeansConfig(dims=DIMS), 1).shape == (2, DIMS)
    for cfg in (fedkmeans.FedKMeansConfig(dims=DIMS, filter_order=0), fedkmeans.FedKMeansConfig(dims=F),
                fedkmeans.FedKMeansConfig(dims=0)):
        assert np.array_equal(fedkmeans.projected(x, cfg, 1), x)
