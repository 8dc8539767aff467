"""fedavg-dmon on a node split with boundary edges: every party's GCN layer is its rows of the
whole graph's (one padded sum of its features), and its local loss is the whole graph's DMoN
loss with the other parties' rows frozen, so the parties' gradients add up to the centralised
one at every round start."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp
import torch

from app.client_app import build_client_app
from fedgraphcore.config import ConfigError
from fedgraphcore.data import load_dataset
from fedgraphcore.data.partition import partition
from app.inprocess import InProcessGrid
from fedgraphcore.models import DMoNModel, adj_to_edge_index, dmon_loss
from fedgraphcore.protocols import boundary
from fedgraphcore.protocols import fedavg_dmon
from fedgraphcore.protocols.fedavg_dmon import boundary as fedavg_dmon_boundary
from fedgraphcore.protocols.fedavg_dmon import gradient as fedavg_dmon_gradient
from app.registry import validate
from app.run import run_experiment
from app.server_app import run_server
from fedgraphcore.transport import unpack

N, K, F = 240, 4, 8
SBM = {"sbm.nodes": N, "sbm.blocks": K, "sbm.features": F, "sbm.signal": 3.0, "sbm.p-in": 0.1, "sbm.p-out": 0.01}
SEED, VAL, TEST = 5, 0.1, 0.2


def sbm():
    return load_dataset("sbm", seed=SEED, nodes=N, blocks=K, features=F, signal=3.0, p_in=0.1, p_out=0.01)


def raw(tmp_path, clients: int, **extra) -> dict:
    return {**SBM, "strategy": "fedavg-dmon", "dataset": "sbm", "seed": SEED, "num-clients": clients,
            "num-rounds": 2, "fedavg-dmon.local-epochs": 3, "out-dir": str(tmp_path / f"run-{clients}"), **extra}


def parties(data, clients: int):
    """Each party's shard, links (positions in partition order, as the server assigns them) and cut."""
    shards = partition(data, "node-random", clients, seed=SEED)
    offsets = np.concatenate([[0], np.cumsum([s.num_nodes for s in shards])[:-1]])
    position = np.empty(data.num_nodes, np.int64)
    for s, off in zip(shards, offsets):
        position[s.node_ids] = off + np.arange(s.num_nodes)
    out = []
    for s, off in zip(shards, offsets):
        links = boundary.Links(int(off), data.num_nodes, position[s.boundary.keys])
        train, vadj, _ = fedavg_dmon.split_adjacency(s.adj, s.node_ids, SEED, VAL, TEST)
        codes = fedavg_dmon_boundary.boundary_codes(s.boundary, s.item_keys, SEED, VAL, TEST)
        out.append((s, train, fedavg_dmon_boundary.cut(train, vadj, s.boundary, codes, links)))
    return out, np.concatenate([s.node_ids for s in shards])


def whole_train(data) -> sp.csr_matrix:
    return fedavg_dmon.split_adjacency(data.adj, np.arange(data.num_nodes), SEED, VAL, TEST)[0]


# --------------------------------------------------------------------------- first layer
def test_padded_feature_sums_give_every_party_its_rows_of_the_whole_graphs_gcn_layer():
    """Plain functions: the parties' B_c F_c summed over parties, then propagated, are the rows of
    A_hat X over the whole graph's training edges; the model on them with no edges (identity
    propagation) gives the centralised GCN layer's output."""
    data = sbm()
    whole = fedavg_dmon.split_adjacency(data.adj, np.arange(N), SEED, VAL, TEST)[0]
    expected = fedavg_dmon_boundary.propagation(whole, data.x)
    shares, order = parties(data, 3)
    total = sum(c.train @ fedavg_dmon_boundary.feature_share(s.x, c.degrees) for s, _, c in shares)
    position = np.empty(N, np.int64)
    position[order] = np.arange(N)
    for s, _, c in shares:
        rows = total[position[s.node_ids]]  # the party's rows of the sum (as the server returns them)
        np.testing.assert_allclose(fedavg_dmon_boundary.propagated(rows, s.x, c.degrees), expected[s.node_ids], atol=1e-12)
    torch.manual_seed(0)
    model = DMoNModel(F, K).double().eval()
    ei, ew = adj_to_edge_index(whole, dtype=torch.float64)
    with torch.no_grad():
        central = model(torch.as_tensor(np.asarray(data.x, np.float64)), ei, ew)
        layered = model(torch.as_tensor(expected), torch.zeros((2, 0), dtype=torch.long))
    np.testing.assert_allclose(layered.numpy(), central.numpy(), atol=1e-12)


def test_the_parties_kept_features_are_the_centralised_rows_after_a_real_run(tmp_path):
    """End to end (in-process Flower, masked padded sums): each party's kept P_c equals its rows
    of the whole graph's A_hat X to 1e-6."""
    config = raw(tmp_path, 3, **{"num-rounds": 1})
    grid = InProcessGrid(build_client_app(config), 3, record=True)
    run_server(grid, config)
    expected = fedavg_dmon_boundary.propagation(whole_train(sbm()), sbm().x)
    seen = 0
    for reply in grid.pulled:
        if reply.metadata.message_type == f"query.{fedavg_dmon.DMON_ASSIGN}":
            ids = unpack(reply.content)[0]["node_ids"]
            state = grid.contexts[reply.metadata.src_node_id].state
            kept = state.array_records["dmon_propagated"]["p"].numpy()
            np.testing.assert_allclose(kept, expected[ids], atol=1e-6)
            seen += 1
    assert seen == 3


# --------------------------------------------------------------------------- one client
def test_one_client_on_a_node_split_with_boundary_gives_the_centralised_labels(tmp_path):
    fed = run_experiment("fedavg-dmon", "sbm", 1, {**SBM, "seed": SEED, "num-rounds": 2,
                                                     "fedavg-dmon.local-epochs": 3, "reference": True},
                         tmp_path / "fed")
    cen = run_experiment("fedavg-dmon", "sbm", 1, {**SBM, "seed": SEED, "num-rounds": 2, "fedavg-dmon.local-epochs": 3,
                                                     "fedavg-dmon.mode": "centralised"}, tmp_path / "cen")
    assert fed["config"]["partition.boundary"] is True and fed["metrics"]["mode"] == "federated"
    labels = [np.loadtxt(tmp_path / d / "labels.csv", delimiter=",", skiprows=1, dtype=np.int64)
              for d in ("fed", "cen")]
    assert np.array_equal(labels[0], labels[1])
    assert fed["reference"]["agreement"]["ari"] == 1.0


# --------------------------------------------------------------------------- the server's view
def test_the_server_sees_only_masked_padded_uploads_and_sums(tmp_path):
    config = raw(tmp_path, 3)
    grid = InProcessGrid(build_client_app(config), 3, record=True)
    result = run_server(grid, config)
    kinds = {}
    for reply in grid.pulled:
        action = reply.metadata.message_type.split(".", 1)[1]
        for name, array in unpack(reply.content)[0].items():
            kinds.setdefault((action, name), set()).add(array.dtype.kind)
    assert kinds[(fedavg_dmon_boundary.DMON_FEATURES, fedavg_dmon_boundary.FEATURES)] == {"u"}
    assert kinds[(fedavg_dmon_boundary.DMON_SPREAD, fedavg_dmon_boundary.SPREAD)] == {"u"}
    assert kinds[(fedavg_dmon_boundary.DMON_SPREAD, fedavg_dmon_boundary.SUMS)] == {"u"}
    # a padded upload is uniform: no column of it is the plain product (values far beyond any degree)
    feats = [unpack(r.content)[0][fedavg_dmon_boundary.FEATURES] for r in grid.pulled
             if r.metadata.message_type == f"query.{fedavg_dmon_boundary.DMON_FEATURES}"]
    assert all(f.dtype == np.uint64 and f.shape == (N, F) and (f > np.uint64(2**60)).mean() > 0.5 for f in feats)
    uploads = {(u["action"], u["name"]): u for u in result["privacy"]["uploads"]}
    assert uploads[(fedavg_dmon_boundary.DMON_FEATURES, fedavg_dmon_boundary.FEATURES)]["masked"]
    assert uploads[(fedavg_dmon_boundary.DMON_SPREAD, fedavg_dmon_boundary.SPREAD)]["masked"]
    assert result["metrics"]["selected_round"] in (1, 2, 3)
    assert result["quality"]["clusters_found"] >= 2


def test_boundary_mode_refuses_copied_nodes_and_client_level_dp():
    base = {**SBM, "strategy": "fedavg-dmon", "dataset": "sbm", "num-clients": 3}
    with pytest.raises(ConfigError, match="partition.overlap=0.5.*valid: partition.overlap=0"):
        validate({**base, "partition.overlap": 0.5})
    with pytest.raises(ConfigError, match="dp-clip=1.0 with partition.boundary=true"):
        validate({**base, "fedavg-dmon.dp-clip": 1.0, "fedavg-dmon.select": "last"})
    validate({**base, "partition.boundary": False, "partition.overlap": 0.5})  # the paper's setting


# --------------------------------------------------------------------------- the loss
def test_the_parties_local_loss_gradients_add_up_to_the_whole_graph_loss_gradient():
    """At the round start (frozen terms from the exact sums, no dropout) the sum over parties of
    grad_W L_c equals grad_W of the whole graph's DMoN loss."""
    data = sbm()
    whole = whole_train(data)
    p = fedavg_dmon_boundary.propagation(whole, data.x)
    torch.manual_seed(1)
    model = DMoNModel(F, K, dropout=0.0).double()
    none = torch.zeros((2, 0), dtype=torch.long)
    s_all = model(torch.as_tensor(p), none)
    ei, ew = adj_to_edge_index(whole, dtype=torch.float64)
    expected = torch.autograd.grad(dmon_loss(s_all, ei, ew, 1.0), list(model.parameters()))
    s_np = s_all.detach().numpy()
    shares, _ = parties(data, 4)
    labels = s_np.argmax(axis=1)
    totals = sum(fedavg_dmon_boundary.party_sums(s_np[s.node_ids], labels[s.node_ids], c) for s, _, c in shares)
    grads = [torch.zeros_like(g) for g in expected]
    for s, train, c in shares:
        neighbour = (whole @ s_np)[s.node_ids]  # (A S)_c, what the padded sum hands the party
        frozen = fedavg_dmon_boundary.frozen_terms(neighbour, s_np[s.node_ids], train, c.degrees, totals, N)
        g = fedavg_dmon_boundary.party_graph(p[s.node_ids], train, c.degrees)
        g.x = torch.as_tensor(p[s.node_ids])
        loss = fedavg_dmon_boundary.party_loss(model(g.x, g.no_edges), g, frozen, 1.0)
        for acc, grad in zip(grads, torch.autograd.grad(loss, list(model.parameters()))):
            acc += grad
    for got, want in zip(grads, expected):
        np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-9, atol=1e-12)


def test_validation_modularity_from_the_parties_counts_is_the_whole_graphs():
    from fedgraphcore.metrics import modularity

    data = sbm()
    vadj = fedavg_dmon.split_adjacency(data.adj, np.arange(N), SEED, VAL, TEST)[1]
    labels = np.random.default_rng(0).integers(0, K, N)
    shares, _ = parties(data, 3)
    s = np.eye(K)[labels]
    totals = sum(fedavg_dmon_boundary.party_sums(s[sh.node_ids], labels[sh.node_ids], c) for sh, _, c in shares)
    onehot_sums = vadj @ s
    intras = [fedavg_dmon_boundary.val_intra(labels[sh.node_ids], onehot_sums[sh.node_ids]) for sh, _, _ in shares]
    assert fedavg_dmon_boundary.validation_modularity(intras, totals, K) == pytest.approx(modularity(vadj, labels), abs=1e-12)


# --------------------------------------------------------------------------- aggregate=gradient
def _sent_weights(grid, action: str) -> dict:
    """The weights of the last ``action`` message pushed (the same to every client)."""
    sent = [m for m in grid.pushed if m.metadata.message_type.endswith("." + action)]
    return {n: a for n, a in unpack(sent[-1].content)[0].items() if n in fedavg_dmon.PARAM_NAMES}


def _centralised(steps: int, dropout: float):
    """Centralised DMoN (``train_dmon``) on the whole graph's training edges: ``steps`` epochs."""
    from fedgraphcore.models import train_dmon

    data = sbm()
    return train_dmon(data.x, whole_train(data), K, SEED, epochs=steps, dropout=dropout, sparse_features=True)


def _gradient_run(tmp_path, clients: int, dropout: float):
    config = raw(tmp_path, clients, **{"fedavg-dmon.aggregate": "gradient", "fedavg-dmon.select": "last",
                                       "fedavg-dmon.dropout": dropout})
    grid = InProcessGrid(build_client_app(config), clients, record=True)
    return grid, run_server(grid, config)


def _assigned_labels(grid) -> np.ndarray:
    labels = np.full(N, -1)
    for reply in grid.pulled:
        if reply.metadata.message_type == f"query.{fedavg_dmon.DMON_ASSIGN}":
            arrays = unpack(reply.content)[0]
            labels[arrays["node_ids"]] = arrays["labels"]
    return labels


def test_gradient_mode_with_one_party_takes_the_centralised_adam_steps_exactly(tmp_path):
    """One party (dropout on: it draws the centralised stream): after num-rounds x local-epochs server
    steps the weights are bit for bit those of centralised training for as many epochs."""
    grid, result = _gradient_run(tmp_path, 1, 0.5)
    labels, model = _centralised(6, 0.5)
    got = _sent_weights(grid, fedavg_dmon.DMON_ASSIGN)
    for name, want in model.state_dict().items():
        assert np.array_equal(got[name], want.numpy()), name
    assert np.array_equal(_assigned_labels(grid), labels)
    losses = [x for h in result["history"] for x in h["losses"]]
    assert losses == pytest.approx(model.loss_history, abs=0)


@pytest.mark.parametrize("dropout", [0.0, 0.5])
def test_gradient_mode_with_three_parties_is_centralised_training(tmp_path, dropout):
    """Three parties: the server's Adam steps on the summed masked gradients give the centralised
    weights to 1e-6 and the same labels, without dropout and with it (every party applies its
    nodes' rows of the centralised epoch's mask); the whole-graph losses the server forms from the
    sums are the centralised ones; every gradient upload it sees is a masked ring array."""
    grid, result = _gradient_run(tmp_path, 3, dropout)
    labels, model = _centralised(6, dropout)
    got = _sent_weights(grid, fedavg_dmon.DMON_ASSIGN)
    for name, want in model.state_dict().items():
        np.testing.assert_allclose(got[name], want.numpy(), atol=1e-6, rtol=0)
    assert np.array_equal(_assigned_labels(grid), labels)
    losses = [x for h in result["history"] for x in h["losses"]]
    np.testing.assert_allclose(losses, model.loss_history, atol=1e-6)
    uploads = [unpack(r.content)[0] for r in grid.pulled if r.metadata.message_type == f"train.{fedavg_dmon_gradient.DMON_GRADIENT}"]
    assert len(uploads) == 3 * 6
    size = fedavg_dmon_gradient.gradient_size(fedavg_dmon.param_shapes(F, K, 64)) + 2
    assert all(set(u) == {fedavg_dmon_gradient.GRADIENT} and u[fedavg_dmon_gradient.GRADIENT].dtype.kind == "u"
               and u[fedavg_dmon_gradient.GRADIENT].shape == (size,) for u in uploads)
    ledger = {(u["action"], u["name"]): u for u in result["privacy"]["uploads"]}
    assert ledger[(fedavg_dmon_gradient.DMON_GRADIENT, fedavg_dmon_gradient.GRADIENT)]["masked"]
    assert result["metrics"]["aggregate"] == "gradient"
    assert not any(r.metadata.message_type == f"train.{fedavg_dmon.DMON_TRAIN}" for r in grid.pulled)


def test_the_aggregate_key_refuses_a_bad_value_in_one_line():
    base = {**SBM, "strategy": "fedavg-dmon", "dataset": "sbm", "num-clients": 3}
    with pytest.raises(ConfigError) as err:
        validate({**base, "fedavg-dmon.aggregate": "mean"})
    assert str(err.value) == ("invalid value 'mean' for 'fedavg-dmon.aggregate'; valid choices: gradient, "
                              "weights")
