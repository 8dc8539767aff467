"""A malicious server picks run-config values at the extremes; no party row may reach it.

Every case runs one strategy in-process (the real ServerApp and ClientApps, the nodes' own
policies in their node configs) with a run-config a malicious server may choose: num-clusters
up to a party's rows and all rows, the largest landmark count, block width and embedding
dimension the validator accepts, secure aggregation on and off. :class:`malicious_server.Capture`
records everything the server reads (clear replies as sent, refused replies, secure sums
after unmasking); :func:`malicious_server.leaks` looks for the parties' rows in it, directly
and through the attacks the protocols admit:

* a row (or, for ``N x b`` blocks, a column) of a read array equal to a party's feature row,
  filtered row or adjacency row, within 1e-6 of the row's scale (plus a secure sum's
  fixed-point resolution); fedkmeans' statistics read as per-cluster sums and ``sum / count``;
* every statistic's count of rows (fedkmeans' cluster sizes, gw-ldp's BatchNorm node
  counts) at least the node policy's ``min-rows`` (its default);
* fedsc: each ``C_p`` inverted with the landmarks ``Z`` and sigma the server sent
  (:func:`fedgraphcore.protocols.fedsc.invert_coefficients`);
* fedspectral-plus: what "determines a row" means for a block that is a linear image of the
  edges, ``S = A Y`` with ``Y`` the server's own blocks: a party's adjacency row is determined
  when the blocks it was sent have rank N (then ``A = S Y^+``, every row; under secure
  aggregation the global graph ``sum_c A_c / r``, every edge), or when one row of a clear
  block equals ``w`` times one row of ``Y`` over every round (a node with one local edge:
  its whole row). Paper mode with one power iteration is linear in ``M_c`` the same way,
  and ``M_c``'s non-zero pattern is the adjacency.
* model uploads (fedavg-dmon, gw-ldp): no row or column of ``uploaded - sent`` parallel to a
  party's feature row (gradient inversion of a one-row batch).

Each run must either hold (nothing found) or stop with a privacy refusal naming a row rule
(:data:`ROW_RULES`), before the array that would have given the rows left the client: the
rows are looked for in what the server read up to the refusal. A run whose configuration
cannot work may also stop with a one-line ConfigError, before anything leaves.

Where the leak is in the protocol itself (docs/security.md: fedsc's noise-free
``Z_p`` / ``C_p``, fedspectral-plus' noise-free blocks, fedkmeans' local centres, kcagc's
local clustering, fedspectral's labels, fedavg-dmon's weights) the expectation is the same:
a noise-free release that gives rows must be refused under the default policy; noised ones
(fedsc ``dp-epsilon``, fedspectral-plus ``noise-multiplier``) and releases that give no
row (labels, summed distances) must still run (:data:`MUST_RUN`).
"""

from __future__ import annotations

import numpy as np
import pytest

from app.client_app import build_client_app
from fedgraphcore.config import ConfigError
from app.inprocess import InProcessGrid
from app.server_app import run_server
from fedgraphcore.session import PrivacyRefused
from fedgraphcore.privacy.policy import MIN_ROWS
from fedgraphcore.protocols import fedkmeans
from malicious_server import Capture, counted_statistics, leaks

#: The node-policy rule the defence names: the least number of a party's rows behind any
#: statistic the server can read.
MIN_ROWS_RULE = "min-rows"
#: Rules a refusal may name: min-rows, and fedspectral-plus' block support rule, which guards
#: the same adjacency rows against blocks on a few nodes.
ROW_RULES = (MIN_ROWS_RULE, "min-block-support")

CLIENTS = 3
NODES = 60  # 20 rows a party
SBM = {"dataset": "sbm", "sbm.nodes": NODES, "sbm.features": 8, "sbm.blocks": 3, "sbm.p-in": 0.3,
       "sbm.p-out": 0.02, "reference": False, "num-clients": CLIENTS, "seed": 1}
PARTY_ROWS = NODES // CLIENTS
STRICT = {"secure-aggregation": True, "min-group": 3}  # the policy of the adversarial fedkmeans run
#: fedsc and fedspectral-plus send one row of an image per row of the data (their built-in min-rows
#: is 1, so that the papers' noise-free modes run): a node protects its rows by asking for more
ROWS_PROTECTED = {MIN_ROWS_RULE: 5}


def run_config(strategy: str, k: int, **keys) -> dict:
    return {**SBM, "strategy": strategy, "num-clusters": k, **keys}


def param(id_: str, strategy: str, k: int, keys: dict | None = None, policy: dict | None = None, marks=()):
    return pytest.param(run_config(strategy, k, **(keys or {})), policy or {}, id=id_, marks=marks)


FEDKMEANS = [
    param(f"fedkmeans-k{k}-{'secure' if secure else 'clear'}-filter{order}", "fedkmeans", k,
          {"fedkmeans.secure": secure, "fedkmeans.filter-order": order, "num-rounds": 5})
    for k in (3, PARTY_ROWS, NODES) for secure in (False, True) for order in (0, 2)
] + [param("fedkmeans-k60-secure-strict-policy", "fedkmeans", NODES, {"fedkmeans.secure": True, "num-rounds": 3},
           STRICT)] + [  # the bounds and the round count a server sets: clipped sums, the finest fixed point, many rounds
    param(f"fedkmeans-secure-bound{bound:g}-scale2^40", "fedkmeans", PARTY_ROWS,
          {"fedkmeans.secure": True, "secagg.bound": bound, "secagg.scale": float(2**40), "num-rounds": 3,
           "fedkmeans.tol": 0.0})
    for bound in (1e-9, 1e12)
] + [param("fedkmeans-k20-500-rounds", "fedkmeans", PARTY_ROWS, {"num-rounds": 500, "fedkmeans.tol": 0.0})]

FEDSC = [
    param(f"fedsc-landmarks{d}-{'secure' if secure else 'clear'}", "fedsc", 3,
          {"fedsc.landmarks": d, "fedsc.secure": secure, "num-rounds": 3}, ROWS_PROTECTED)
    for d in (0, NODES) for secure in (False, True)
] + [
    param("fedsc-landmarks60-filter2", "fedsc", 3, {"fedsc.landmarks": NODES, "fedsc.filter-order": 2, "num-rounds": 3},
          ROWS_PROTECTED),
    param("fedsc-k60", "fedsc", NODES, {"fedsc.landmarks": NODES, "num-rounds": 2}, ROWS_PROTECTED),
    param("fedsc-data-noise", "fedsc", 3, {"fedsc.landmarks": NODES, "fedsc.data-noise": 0.3, "num-rounds": 3},
          ROWS_PROTECTED),
    param("fedsc-dp", "fedsc", 3, {"fedsc.landmarks": 20, "fedsc.sigma": 3.0, "fedsc.dp-epsilon": 8.0,
                                   "num-rounds": 3}, ROWS_PROTECTED),
]

SPECTRAL_PLUS = [
    param(f"fedspectral-plus-exact-k{k}-block{b}-{'secure' if secure else 'clear'}", "fedspectral-plus", k,
          {"fedspectral-plus.block": b, "fedspectral-plus.secure": secure}, ROWS_PROTECTED)
    for k, b in ((3, 0), (3, NODES), (NODES, 0)) for secure in (False, True)
] + [
    param(f"fedspectral-plus-paper-{'secure' if secure else 'clear'}", "fedspectral-plus", 3,
          {"fedspectral-plus.mode": "paper", "fedspectral-plus.rounds": 3, "fedspectral-plus.secure": secure},
          ROWS_PROTECTED)
    for secure in (False, True)
] + [
    param("fedspectral-plus-paper-iters1-k60", "fedspectral-plus", NODES,
          {"fedspectral-plus.mode": "paper", "fedspectral-plus.iters": 1, "fedspectral-plus.rounds": 1},
          ROWS_PROTECTED),
    param("fedspectral-plus-exact-block60-noised", "fedspectral-plus", 3,
          {"fedspectral-plus.block": NODES, "fedspectral-plus.noise-multiplier": 1.0, "fedspectral-plus.rounds": 3},
          ROWS_PROTECTED),
]

FEDSPECTRAL = [param(f"fedspectral-k{k}", "fedspectral", k) for k in (3, NODES)]

KCAGC = [  # kcagc-basic shares kcagc's client: its steps at k = a party's rows run with kcagc's
    param(f"{name}-k{k}-{embedding}", name, k,
          {"sbm.features": 12, "kcagc.mode": "paper", "kcagc.embedding": embedding, "kcagc.restarts": 1,
           "kcagc.iterations": 3, "kcagc.local-restarts": 1, "kcagc.local-factor": 10**7, "kcagc.embed-dim": 10**6})
    for name, k, embedding in (("kcagc", 3, "projection-unit"), ("kcagc-basic", 3, "projection-unit"),
                               ("kcagc", PARTY_ROWS, "svd"), ("kcagc", PARTY_ROWS, "filtered"))
] + [  # every node a virtual node and a seed: the summed distances of every pair (rows up to isometry only)
    param("kcagc-basic-k30-filtered", "kcagc-basic", NODES // 2,
          {"sbm.nodes": NODES // 2, "sbm.features": 12, "kcagc.embedding": "filtered", "kcagc.restarts": 1,
           "kcagc.iterations": 2}),
    # exact mode, its block as wide as the nodes: the server learns the pooled Gram F F^T (the ledger says
    # so), inner products of rows summed over parties, never one party's row
    param("kcagc-exact-k60", "kcagc", NODES, {"sbm.features": 12, "kcagc.mode": "exact", "kcagc.filter-order": 2}),
]

FEDAVG_DMON = [
    param(f"fedavg-dmon-k{k}-{'secure' if secure else 'clear'}", "fedavg-dmon", k,
          {"fedavg-dmon.secure": secure, "num-rounds": 2, "fedavg-dmon.local-epochs": 1, "fedavg-dmon.hidden": 8})
    for k in (3, NODES) for secure in (False, True)
]

GW_LDP = [
    param(f"gw-ldp-khop-epsilon-{eps}", "gw-ldp", 3,
          {"partitioner": "khop", "khop.hops": 1, "khop.centres": 30, "gw-ldp.model": "gin", "num-rounds": 1,
           "gw-ldp.local-epochs": 1, "gw-ldp.epsilon": eps, "gw-ldp.svc": False})
    for eps in ("inf", 0.0)
]

#: Cases whose correct outcome is a completed run: noised releases, and releases that give no row.
MUST_RUN = {"fedsc-dp", "fedspectral-plus-exact-block60-noised", "fedspectral-k3", "fedspectral-k60",
            "kcagc-k3-projection-unit", "kcagc-basic-k3-projection-unit", "kcagc-exact-k60", "fedavg-dmon-k3-clear",
            "fedavg-dmon-k3-secure", "gw-ldp-khop-epsilon-inf", "gw-ldp-khop-epsilon-0.0"}


def node_configs(policy: dict) -> list[dict]:
    return [{"partition-id": i, "num-partitions": CLIENTS, **{f"privacy.all.{k}": v for k, v in policy.items()}}
            for i in range(CLIENTS)]


def attack(raw: dict, policy: dict, monkeypatch, tmp_path) -> tuple[Capture, Exception | None]:
    """Run ``raw`` under every node's ``policy``, recording what the server reads; the run's
    stopping error (None: it completed)."""
    capture = Capture().install(monkeypatch)
    raw = {**raw, "out-dir": str(tmp_path / "run")}
    try:
        run_server(InProcessGrid(build_client_app(raw), CLIENTS, node_configs(policy)), raw)
    except Exception as err:  # judged after the search: what was read before it counts all the same
        return capture, err
    return capture, None


def described(capture: Capture, k: int) -> list[str]:
    """What the server read that gives rows, one line each (empty: nothing)."""
    floor = MIN_ROWS
    found = [str(leak) for leak in sorted(leaks(capture, k), key=str)]
    small = {(r.step, r.name, r.kind): count for r, count in counted_statistics(capture, k) if count < floor}
    found += [f"{step}/{name} ({kind}): a statistic over {count} row(s), below min-rows={floor}"
              for (step, name, kind), count in small.items()]
    return found


@pytest.mark.parametrize("raw, policy",
                         FEDKMEANS + FEDSC + SPECTRAL_PLUS + FEDSPECTRAL + KCAGC + FEDAVG_DMON + GW_LDP)
def test_the_server_reads_no_party_row(raw, policy, monkeypatch, tmp_path, request):
    capture, stopped = attack(raw, policy, monkeypatch, tmp_path)
    found = described(capture, raw["num-clusters"])
    assert not found, "the server read party rows:\n  " + "\n  ".join(found)
    if isinstance(stopped, PrivacyRefused):
        rules = {rule for rule, _ in stopped.refusals.values()}
        assert rules <= set(ROW_RULES), f"refused by {rules}, expected one of {ROW_RULES}: {stopped}"
    else:
        assert stopped is None or isinstance(stopped, ConfigError), (
            f"the run stopped with {type(stopped).__name__}: {stopped}; expected it to complete, a PrivacyRefused "
            f"naming one of {ROW_RULES}, or a ConfigError")
    case_id = request.node.callspec.id
    if case_id in MUST_RUN:
        assert stopped is None, f"{case_id} releases no row, yet the run stopped: {stopped}"


# -- the harness itself: it finds what it is meant to find ---------------------------------------
def test_the_capture_sees_hello_arrays_clear_replies_and_unmasked_sums(monkeypatch, tmp_path):
    """The recording is complete: hello's arrays, every clear reply, each secure sum after unmasking
    (its step's name), and masked uploads kept apart (never searched)."""
    capture, stopped = attack(run_config("fedkmeans", 3, **{"fedkmeans.secure": True, "num-rounds": 2}), {},
                              monkeypatch, tmp_path)
    kinds = {(r.step, r.name, r.kind) for r in capture.reads}
    assert stopped is None or isinstance(stopped, PrivacyRefused), stopped
    assert ("hello", "centres", "clear") in kinds or ("hello", "counts", "clear") in kinds or stopped is not None
    if stopped is None:
        assert {("kmeans_step", "stats", "masked"), ("kmeans_step", "stats", "sum"),
                ("kmeans_assign", "labels", "clear")} <= kinds
        sums = [r.array for r in capture.reads if r.kind == "sum"]
        assert all(s.dtype == np.float64 for s in sums)
    assert len(capture.clients) == CLIENTS


def test_the_row_search_finds_a_planted_row_and_a_one_row_mean():
    from malicious_server import Read, _views, equal_rows

    rows = np.arange(12.0).reshape(3, 4) + 1.0
    assert equal_rows(np.vstack([rows[1] + 1e-9, np.zeros(4)]), rows).tolist() == [1]
    assert equal_rows(rows * (1 + 1e-4), rows).size == 0  # a scaled row is no row
    capture = Capture()
    k = 2
    stats = fedkmeans.join_statistics(np.vstack([rows[2], rows[0] + rows[1]]), np.array([1.0, 2.0]), 0.0, 0.5)
    capture.reads.append(Read("kmeans_step", None, "stats", np.stack([stats, stats]), "sum", 1))  # two starts
    counted = counted_statistics(capture, k)
    assert [count for _, count in counted] == [1]
    views = dict(_views(capture.reads[0], capture, k))
    assert equal_rows(views["mean"], rows).tolist() == [2]  # the one-row cluster; the two-row mean is none


def test_the_fedsc_inversion_recovers_samples_from_noise_free_factors():
    """The attack the fedsc check runs, on its own: noise-free C_p and Z give the samples."""
    from fedgraphcore.protocols.fedsc import init_landmarks, invert_coefficients, solve_coefficients
    from malicious_server import equal_rows

    x = np.random.default_rng(0).normal(size=(20, 4))
    z = init_landmarks(12, 4, 0) * 2
    c = solve_coefficients(x, z, 2.0, 1e-4)
    assert equal_rows(invert_coefficients(z, c, 2.0, 1e-4), x, rtol=1e-4).size == 20


@pytest.mark.parametrize("secure", [False, True])
def test_an_honest_fedkmeans_run_is_not_refused_by_the_default_policy(secure, monkeypatch, tmp_path):
    """The safe default refuses what gives rows, not an ordinary run: k = the number of blocks on
    200 rows a party completes, and its statistics still hold no row."""
    raw = {**run_config("fedkmeans", 3, **{"fedkmeans.secure": secure, "num-rounds": 10}), "sbm.nodes": 600}
    capture, stopped = attack(raw, {}, monkeypatch, tmp_path)
    assert stopped is None, f"an honest run stopped: {stopped}"
    assert not described(capture, 3)


@pytest.mark.parametrize("raw", [
    run_config("fedsc", 3, **{"fedsc.landmarks": NODES, "num-rounds": 2}),
    run_config("fedspectral-plus", 3, **{"fedspectral-plus.block": NODES}),
], ids=["fedsc", "fedspectral-plus"])
def test_under_their_built_in_min_rows_the_noise_free_row_images_run_and_give_rows(raw, monkeypatch, tmp_path):
    """What docs/security.md says of fedsc and fedspectral-plus: their built-in ``min-rows`` is 1, so
    the papers' noise-free modes run, and then a server that picks the request reads the rows."""
    capture, stopped = attack(raw, {}, monkeypatch, tmp_path)
    assert stopped is None
    assert leaks(capture, raw["num-clusters"])
