"""kCAGC exact mode (``kcagc.mode = exact``): centralised AGC's labels from secure sums of the
parties' Gram products; protocol math and end-to-end runs on the in-process grid."""

from __future__ import annotations

import numpy as np
import pytest

from app.client_app import build_client_app
from fedgraphcore.config import ConfigError
from fedgraphcore.data import load_dataset
from fedgraphcore.data.partition import partition
from fedgraphcore.graph_filters import agc, agc_intra_distance, low_pass_filter
from app.inprocess import InProcessGrid
from fedgraphcore.metrics import ari
from fedgraphcore.privacy.secagg import FixedPointEncoder
from fedgraphcore.protocols.kcagc import exact
from app.registry import STRATEGIES, schema
from fedgraphcore.session import PrivacyRefused
from fedgraphcore.transport import refused_rule
from app.run import run_experiment
from app.server_app import run_server
from fedgraphcore.transport import pack, unpack
from fedgraphcore.wire import ProtocolError
from clients.kcagc import KCAGCClient
from conftest import patch_reply
from strategies.kcagc.exact import ExactAGC

N = 240
SBM = {"sbm.nodes": N, "sbm.features": 12, "sbm.blocks": 4, "sbm.signal": 3.0}


def sbm(seed: int = 0):
    return load_dataset("sbm", seed=seed, nodes=N, features=12, blocks=4, signal=3.0)


def reference(config: dict, data) -> np.ndarray:
    """``kcagc``'s own centralised reference for this run-config."""
    raw = {**config, "strategy": "kcagc", "dataset": "sbm", "num-clusters": 4}
    return STRATEGIES["kcagc"].strategy(schema().validate(raw)).reference(data)


# --------------------------------------------------------------------------- protocol math
def test_parties_gram_products_add_up_to_the_pooled_operator():
    data = sbm()
    shards = partition(data, "vertical", 3, seed=0)
    y = np.random.default_rng(0).standard_normal((N, 8))
    parts = [exact.filtered_block(s.x, s.adj, 3) for s in shards]
    pooled = low_pass_filter(data.x, data.adj, 3)
    cols = np.concatenate([s.feature_cols for s in shards])
    assert np.allclose(np.hstack(parts), pooled[:, cols], atol=1e-12)
    distributed = sum(exact.gram_product(f, y) for f in parts)
    assert np.abs(distributed - pooled @ (pooled.T @ y)).max() <= 1e-10 * max(1.0, np.abs(distributed).max())
    # the other two sums add up too, and every party's entries stay within the declared bounds
    labels = np.random.default_rng(1).integers(0, 4, N)
    assert sum(exact.intra_part(f, labels) for f in parts) == pytest.approx(agc_intra_distance(pooled, labels))
    c = sum(exact.squared_norm(f) for f in parts)
    assert c == pytest.approx(np.linalg.norm(pooled) ** 2)
    for f in parts:
        assert np.abs(exact.gram_product(f, y)).max() <= exact.product_bound(c, y)
        assert exact.intra_part(f, labels) <= exact.intra_bound(c)
    # a block filtered further from a kept order equals filtering from the start
    assert np.allclose(exact.filtered_block(shards[0].x, shards[0].adj, 5, start=(3, parts[0])),
                       exact.filtered_block(shards[0].x, shards[0].adj, 5), atol=1e-12)


def test_wire_scale_puts_every_bound_into_the_64_bit_ring():
    for bound in (1e-9, 0.3, 1.0, 2.0**31, 7.3e12):
        t = exact.wire_scale(bound)
        assert 2.0**31 < t * bound <= 2.0**32 and np.log2(t) == int(np.log2(t))
        assert FixedPointEncoder(2.0**20, t * bound, 16).dtype == np.uint64
    with pytest.raises(ValueError, match="finite and > 0"):
        exact.wire_scale(0.0)


@pytest.mark.parametrize("order", [2, None])
def test_driver_on_local_sums_gives_the_reference_labels(order):
    data = sbm()
    shards = partition(data, "vertical", 3, seed=0)

    def block(s, psi):
        return exact.filtered_block(s.x, s.adj, psi)

    c = sum(exact.squared_norm(block(s, order or 1)) for s in shards)
    out = exact.exact_agc(lambda psi, y: sum(exact.gram_product(block(s, psi), y) for s in shards) / c,
                          lambda psi, lab: sum(exact.intra_part(block(s, psi), lab) for s in shards),
                          N, 4, 4, 0, order, 60)
    ref, psi = agc(data.x, data.adj, 4, 0, order=order)
    assert out.order == psi and np.array_equal(out.labels, ref)
    assert all(s.converged for s in out.solves)


def test_adaptive_order_stops_where_agc_does():
    search = exact.AdaptiveOrder(max_order=10)
    labels = [np.full(3, i) for i in range(5)]
    assert not search.feed(1, labels[1], 5.0) and not search.feed(2, labels[2], 4.0)
    assert search.feed(3, labels[3], 4.5)
    assert search.order == 2 and search.labels is labels[2] and search.history == [5.0, 4.0, 4.5]
    last = exact.AdaptiveOrder(max_order=2)
    assert not last.feed(1, labels[1], 2.0) and last.feed(2, labels[2], 1.0) and last.order == 2


# --------------------------------------------------------------------------- end to end
def test_one_client_gives_the_reference_labels_exactly(out_dir):
    config = {**SBM, "kcagc.filter-order": 2}
    result = run_experiment("kcagc", "sbm", 1, config, out_dir)
    labels = np.load(out_dir / "labels.npy")
    assert np.array_equal(labels, reference(config, sbm()))
    metrics = result["metrics"]
    assert metrics["mode"] == "exact" and metrics["filter_order"] == 2 and metrics["converged"]
    assert metrics["protocol_rounds"] == result["timing"]["rounds"] == metrics["product_rounds"] + 2
    assert metrics["bytes_up"] > 0 and metrics["bytes_down"] > 0


@pytest.mark.parametrize("clients,config", [(3, {"kcagc.filter-order": 2}),
                                            (4, {"kcagc.filter-order": 3, "kcagc.filter": "spectral-norm"}),
                                            (3, {})])  # the SBM's default: AGC's adaptive order
def test_several_clients_give_the_reference_labels(out_dir, clients, config):
    config = {**SBM, **config}
    result = run_experiment("kcagc", "sbm", clients, config, out_dir)
    labels = np.load(out_dir / "labels.npy")
    assert ari(labels, reference(config, sbm())) >= 0.99
    assert result["reference"]["agreement"]["ari"] >= 0.99
    assert result["communication"]["secure_aggregations"] == result["metrics"]["protocol_rounds"] - 1
    if not config.get("kcagc.filter-order"):
        assert result["metrics"]["filter_order"] == agc(sbm().x, sbm().adj, 4, 0)[1]
        assert result["metrics"]["adaptive_order"]


def test_the_server_sees_masked_sums_only(out_dir):
    raw = {**SBM, "strategy": "kcagc", "dataset": "sbm", "num-clients": 3, "kcagc.filter-order": 2,
           "out-dir": str(out_dir)}
    grid = InProcessGrid(build_client_app(raw), 3, record=True)
    result = run_server(grid, raw)
    replies = [unpack(r.content) for r in grid.pulled if r.metadata.message_type == "query.kcagc_exact"]
    assert replies
    for arrays, values in replies:
        assert set(values) <= {"cols"}
        for array in arrays.values():
            assert array.dtype == np.uint64  # masked in the 64-bit ring, never a float
    # nothing any client sent holds floats of n rows (its block, its products)
    for reply in grid.pulled:
        for array in unpack(reply.content)[0].values():
            assert not (array.dtype.kind == "f" and array.shape[:1] == (N,))
    # a product upload looks uniform, not like small fixed-point numbers
    product = next(a["p"] for a, _ in replies if "p" in a)
    assert product.shape[0] == N and len(np.unique(product >> np.uint64(60))) == 16
    uploads = [u for u in result["privacy"]["uploads"] if u["action"] == "kcagc_exact"]
    assert {u["name"]: u["masked"] for u in uploads} == {"s": True, "p": True, "cols": False}
    ledger = {m["name"]: m for m in result["privacy"]["mechanisms"]}
    assert "kcagc:exact-gram-products" in ledger and "secure-aggregation" in ledger


def test_a_declared_bound_below_the_honest_one_is_refused(out_dir, monkeypatch):
    """A server that declares a product bound too small to hold a client's entries (so that
    clipping would alter them) is refused by the client, which knows its own bound."""
    honest = ExactAGC.norms
    monkeypatch.setattr(ExactAGC, "norms", lambda self, order: (honest(self, order)[0] * 1e-3, honest(self, order)[1]))
    with pytest.raises(PrivacyRefused, match="secagg-bound"):
        run_experiment("kcagc", "sbm", 2, {**SBM, "kcagc.filter-order": 2}, out_dir)


def test_a_negative_squared_norm_stops_the_run(out_dir, monkeypatch):
    patch_reply(monkeypatch, KCAGCClient, "kcagc_exact",
                lambda shard, arrays, values: ({**arrays, "s": -np.abs(arrays["s"]) - 1.0}
                                               if "s" in arrays else arrays, values))
    with pytest.raises(ProtocolError, match=r"kcagc_exact.*norm.*< 0"):
        run_experiment("kcagc", "sbm", 1, {**SBM, "kcagc.filter-order": 2}, out_dir)


def test_bad_mode_is_one_line(out_dir):
    with pytest.raises(ConfigError, match=r"'fast'.*kcagc\.mode.*valid choices: exact, paper") as err:
        run_experiment("kcagc", "sbm", 2, {"kcagc.mode": "fast"}, out_dir)
    assert "\n" not in str(err.value)
    assert not out_dir.exists()


def test_paper_mode_stays_the_papers_protocol(out_dir):
    result = run_experiment("kcagc", "sbm", 2, {**SBM, "kcagc.mode": "paper", "kcagc.filter-order": 2,
                                                "kcagc.restarts": 2, "kcagc.local-restarts": 1}, out_dir)
    actions = {r["action"] for r in result["timing"]["per_round"]}
    assert "kcagc_local" in actions and "kcagc_exact" not in actions
    assert result["metrics"]["virtual_nodes"]


class UntaggedGrid(InProcessGrid):
    """A server that strips the masking values from every ``kcagc_exact`` request (asks for clear parts)."""

    def push_messages(self, messages):
        messages = list(messages)
        for message in messages:
            if message.metadata.message_type == "query.kcagc_exact":
                arrays, values = unpack(message.content)
                message.content = pack(arrays, {k: v for k, v in values.items() if not k.startswith("secagg_")})
        return super().push_messages(messages)


def test_a_request_without_masking_is_refused(out_dir):
    raw = {**SBM, "strategy": "kcagc", "dataset": "sbm", "num-clients": 2, "kcagc.filter-order": 2,
           "out-dir": str(out_dir)}
    grid = UntaggedGrid(build_client_app(raw), 2, record=True)
    with pytest.raises(PrivacyRefused, match=r"step 'kcagc_exact'.*rule 'secure-aggregation'"):
        run_server(grid, raw)
    # every client answered with its refusal, none with its part in clear
    answers = [r for r in grid.pulled if r.metadata.message_type == "query.kcagc_exact"]
    assert [refused_rule(r.content) for r in answers] == ["secure-aggregation"] * 2


class StageRewritingGrid(InProcessGrid):
    """A server that asks every ``kcagc_exact`` request for a stage the protocol does not have."""

    def push_messages(self, messages):
        messages = list(messages)
        for message in messages:
            if message.metadata.message_type == "query.kcagc_exact":
                arrays, values = unpack(message.content)
                message.content = pack(arrays, {**values, "stage": "rows"})
        return super().push_messages(messages)


def test_a_request_for_an_unknown_stage_is_refused_as_a_protocol_error(out_dir):
    """The client names the fault with the project's error type, not as a bug (a bare ValueError)."""
    raw = {**SBM, "strategy": "kcagc", "dataset": "sbm", "num-clients": 2, "kcagc.filter-order": 2,
           "out-dir": str(out_dir)}
    with pytest.raises(ProtocolError, match=r"step 'kcagc_exact'.*ProtocolError in step 'kcagc_exact'"):
        run_server(StageRewritingGrid(build_client_app(raw), 2), raw)
