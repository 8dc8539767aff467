"""A node's own privacy policy, enforced by its client whatever the run or the server asks.

Each attack is a server (or run-config) that asks for more than the node allows; each
is refused with :class:`PrivacyRefusal` naming the rule, and the server's run stops with
:class:`PrivacyRefused` naming the client. Runs use the in-process grid with per-client
node configs (what ``flower-supernode --node-config`` gives in a deployment).
"""

from __future__ import annotations

import contextlib
import logging
import re

import json
from types import SimpleNamespace

import numpy as np
import pytest
from flwr.app import Context, RecordDict

from app.client_app import build_client_app
from fedgraphcore.config import ConfigError
from fedgraphcore.data.params import dataset_kwargs, partition_kwargs
from fedgraphcore.data.shards import client_shard
from fedgraphcore.disclosure import LOGGER
from app.inprocess import InProcessGrid
from fedgraphcore.privacy.budget import NodeLedger, composed_epsilon
from fedgraphcore.privacy.policy import PrivacyRefusal, node_policy
from fedgraphcore.privacy.secagg import FixedPointEncoder, pack_id_bytes, unmask_sum
from fedgraphcore.protocols.kcagc import tree_groups
from app.registry import validate
from app.server_app import run_server
from fedgraphcore.session import PrivacyRefused
from fedgraphcore.transport import refused_rule
from fedgraphcore.wire import SECAGG_PEER, ProtocolError
from fedgraphcore.transport import pack, unpack
from clients.fedkmeans import FedKMeansClient
from clients.fedsc import FedSCClient

SBM = {"sbm.nodes": 200, "sbm.features": 8, "sbm.blocks": 4, "reference": False}


class MaliciousServerGrid(InProcessGrid):
    """The server rewrites every ``<query|train>.<action>`` message: ``rewrite(partition, arrays,
    values) -> (arrays, values)`` before the client sees it."""

    def __init__(self, *args, action: str, rewrite, **kwargs):
        super().__init__(*args, **kwargs)
        self.action, self.rewrite = action, rewrite

    def push_messages(self, messages):
        messages = list(messages)
        for message in messages:
            if message.metadata.message_type.split(".", 1)[1] == self.action:
                partition = self.contexts[message.metadata.dst_node_id].node_config["partition-id"]
                message.content = pack(*self.rewrite(partition, *unpack(message.content)))
        return super().push_messages(messages)


def node_configs(n: int, **privacy) -> list[dict]:
    """Simulation node configs of ``n`` clients, each with the same ``privacy.*`` keys."""
    return [{"partition-id": i, "num-partitions": n, **{f"privacy.{k}": v for k, v in privacy.items()}}
            for i in range(n)]


def run(raw: dict, tmp_path, grid_cls=InProcessGrid, configs=None, **grid_kwargs) -> dict:
    raw = {**raw, "out-dir": str(tmp_path / f"run-{len(list(tmp_path.iterdir()))}")}
    n = int(raw["num-clients"])
    return run_server(grid_cls(build_client_app(raw), n, configs or node_configs(n), **grid_kwargs), raw)


@contextlib.contextmanager
def refused(caplog, server: str, party: str):
    """The run stops with PrivacyRefused matching ``server`` (the rule: all a party tells the server),
    and the refusing party's own log matches ``party`` (what was asked and what its policy allows)."""
    caplog.clear()
    with caplog.at_level(logging.ERROR, logger=LOGGER.name), pytest.raises(PrivacyRefused, match=server) as err:
        yield err
    assert re.search(party, caplog.text), caplog.text


def refusal(err: pytest.ExceptionInfo) -> dict[int, str]:
    return {client: rule for client, (rule, _) in err.value.refusals.items()}


# --------------------------------------------------------------------------- the policy itself
def test_policy_from_inline_keys_and_a_file_inline_winning(tmp_path):
    path = tmp_path / "policy.toml"
    path.write_text("[all]\nsecure-aggregation = true\nmin-group = 3\n[fedsc]\nepsilon = 4.0\nnoise-multiplier = 1\n")
    policy = node_policy({"privacy-policy": str(path), "privacy.fedsc.epsilon": 2, "shard": str(tmp_path / "c.npz")})
    fedsc = policy.for_strategy("fedsc")
    assert fedsc["secure-aggregation"] is True and fedsc["min-group"] == 3
    assert fedsc["epsilon"] == 2.0 and fedsc["noise-multiplier"] == 1.0 and fedsc["delta"] == 1e-5
    assert policy.for_strategy("kcagc")["epsilon"] == float("inf")  # fedsc's section only
    assert fedsc.ledger == tmp_path / "c.npz.privacy-ledger.jsonl"  # beside the data
    assert node_policy({"privacy-ledger": "/x/l.jsonl"}).ledger.as_posix() == "/x/l.jsonl"
    assert node_policy({"partition-id": 0}).ledger is None  # simulation: the run context
    assert node_policy({"data": "memory:0123abcd"}).ledger is None  # in-memory data: no file in the cwd


@pytest.mark.parametrize("config, message", [
    ({"privacy.fedsc.epsilon": -1.0}, r"^node config 'privacy.fedsc.epsilon': section 'fedsc': value -1.0 for "
                                      r"'epsilon' is out of range; valid range: \[0, inf\]$"),
    ({"privacy.fedkmeans.noise-multiplier": 2.0}, r"^node config 'privacy.fedkmeans.noise-multiplier': rule "
                                                  r"'noise-multiplier' does not apply to strategy 'fedkmeans'; it "
                                                  r"applies to fedspectral-plus, fedsc, fedavg-dmon$"),
    ({"privacy.fedsc.secure": True}, r"^node config 'privacy.fedsc.secure': unknown privacy policy rule 'secure' "
                                     r"in section 'fedsc'; valid: secure-aggregation, min-group, noise-multiplier, "
                                     r"epsilon, delta, min-rows, label-releases, min-block-support$"),
    ({"privacy.kmeans.min-group": 3}, r"^node config 'privacy.kmeans.min-group': unknown privacy policy section "
                                      r"'kmeans'; valid: all, fedkmeans, "),
])
def test_a_bad_policy_is_one_line_naming_key_and_choices(config, message):
    with pytest.raises(ConfigError, match=message):
        node_policy(config)


def test_a_bad_policy_file_names_file_and_line(tmp_path):
    path = tmp_path / "policy.toml"
    path.write_text("[fedsc]\nepsilon = = 3\n")
    with pytest.raises(ConfigError, match=rf"^privacy policy {path}: .*line 2"):
        node_policy({"privacy-policy": str(path)})
    with pytest.raises(ConfigError, match=rf"^cannot read the privacy policy {tmp_path / 'none.toml'}: "):
        node_policy({"privacy-policy": str(tmp_path / "none.toml")})


def test_a_rule_a_strategy_cannot_meet_refuses_the_whole_run(tmp_path, caplog):
    raw = {**SBM, "strategy": "kcagc", "dataset": "sbm", "num-clients": 2, "kcagc.restarts": 2}
    with refused(caplog, r"^step 'hello' refused by the privacy policy of node 1001, rule 'noise-multiplier'$",
                 r"rule 'noise-multiplier': this node sets noise-multiplier=2.0 for strategy 'kcagc', which cannot "
                 r"meet it"):
        run(raw, tmp_path, configs=[{"partition-id": 0, "num-partitions": 2, "privacy.all.noise-multiplier": 2.0},
                                    {"partition-id": 1, "num-partitions": 2}])


# --------------------------------------------------------------------------- missing secagg_tag
MASKING_RUNS = {
    "fedkmeans": ({"dataset": "sbm", **SBM, "fedkmeans.secure": True, "num-rounds": 2}, "kmeans_step"),
    "kcagc": ({"dataset": "sbm", **SBM, "kcagc.mode": "paper", "kcagc.restarts": 2, "kcagc.iterations": 1},
              "kcagc_step"),
    "fedspectral-plus": ({"dataset": "sbm", **SBM, "fedspectral-plus.mode": "paper", "fedspectral-plus.secure": True,
                          "fedspectral-plus.rounds": 2}, "fedspectral_power"),
    "fedsc": ({"dataset": "iris", "fedsc.secure": True, "num-rounds": 2, "fedsc.landmarks": 12}, "fedsc_round"),
    "fedavg-dmon": ({"dataset": "sbm", **SBM, "fedavg-dmon.secure": True, "num-rounds": 1,
                     "fedavg-dmon.local-epochs": 1, "fedavg-dmon.select": "last"}, "dmon_gradient"),
}


def strip_masking(partition, arrays, values):
    return arrays, {k: v for k, v in values.items() if not k.startswith("secagg_")}


@pytest.mark.parametrize("strategy", sorted(MASKING_RUNS))
def test_a_request_without_its_secagg_tag_is_refused(strategy, tmp_path, caplog):
    """A server that leaves the tag out gets no clear float64 reply, in any of the five strategies."""
    overrides, action = MASKING_RUNS[strategy]
    raw = {**overrides, "strategy": strategy, "num-clients": 3}
    with refused(caplog, rf"^step '{action}' refused by the privacy policy of client 0 \(node 1001\), rule "
                         r"'secure-aggregation'; client 1",
                 rf"rule 'secure-aggregation': '{action}' was requested without secure aggregation \(no secagg_tag\), "
                 r"but this run's configuration masks it") as err:
        run(raw, tmp_path, MaliciousServerGrid, action=action, rewrite=strip_masking)
    assert refusal(err) == {0: "secure-aggregation", 1: "secure-aggregation", 2: "secure-aggregation"}


def test_a_node_requiring_secure_aggregation_refuses_a_run_configured_without_it(tmp_path, caplog):
    """The node config decides, not the run-config: fedkmeans.secure=false in the run."""
    raw = {**SBM, "strategy": "fedkmeans", "dataset": "sbm", "num-clients": 2, "num-rounds": 2}
    configs = node_configs(2)
    configs[1]["privacy.fedkmeans.secure-aggregation"] = True
    with refused(caplog, r"client 1 \(node 1002\), rule 'secure-aggregation'$",
                 r"rule 'secure-aggregation': 'kmeans_step' was requested without secure aggregation "
                 r"\(no secagg_tag\); this node only sends it masked") as err:
        run(raw, tmp_path, configs=configs)
    assert refusal(err) == {1: "secure-aggregation"}
    result = run({**raw, "fedkmeans.secure": True}, tmp_path, configs=configs)  # masked: answered
    assert all(u["masked"] for u in result["privacy"]["uploads"] if u["action"] == "kmeans_step")


def test_a_node_refuses_a_masking_group_below_its_minimum(tmp_path, caplog):
    raw = {**MASKING_RUNS["fedkmeans"][0], "strategy": "fedkmeans", "num-clients": 2}
    with refused(caplog, r"^step 'hello' refused by the privacy policy of node 1001, rule 'min-group'; node 1002",
                 r"rule 'min-group': a masking group of 2 client\(s\), below this node's min-group=3") as err:
        run(raw, tmp_path, configs=node_configs(2, **{"fedkmeans.min-group": 3}))
    assert set(refusal(err).values()) == {"min-group"}


# --------------------------------------------------------------------------- chosen masking groups
def test_kcagc_refuses_masking_groups_the_protocol_does_not_define(tmp_path, caplog):
    """A server sending groups {0, 1}, {1, 2}, {0, 2} under fresh tags would solve the three
    pair sums for client 0's partial distances (to within 3.6e-9)."""
    pairs = {0: [0, 1], 1: [1, 2], 2: [0, 2]}

    def choose_pairs(partition, arrays, values):
        return {**arrays, "group": np.asarray(pairs[partition], dtype=np.int64)}, values

    raw = {**MASKING_RUNS["kcagc"][0], "strategy": "kcagc", "num-clients": 3}
    with refused(caplog, r"rule 'masking-group'",
                 r"rule 'masking-group': masking group \[0, 1\] is not one of the protocol's groups "
                 r"\[\[0, 1, 2\]\]") as err:
        run(raw, tmp_path, MaliciousServerGrid, action="kcagc_step", rewrite=choose_pairs)
    assert refusal(err) == {0: "masking-group", 1: "masking-group", 2: "masking-group"}
    # the tree variant allows its internal nodes only: with three clients, the root alone
    with pytest.raises(PrivacyRefused, match=r"rule 'masking-group'"):
        run({**raw, "kcagc.tree": True}, tmp_path, MaliciousServerGrid, action="kcagc_step", rewrite=choose_pairs)


@pytest.mark.parametrize("parties", range(2, 41))
def test_no_tree_arrangement_leaves_a_client_alone_in_any_combination_of_sums(parties):
    """The server learns one sum per internal node; no linear combination of them may be one
    client's part (with an odd client passed up alone, a group's sum minus its other child's was)."""
    groups = [g for level in tree_groups(parties)[1:] for g in level]
    indicators = np.array([[p in g for p in range(parties)] for g in groups], dtype=float)
    for p in range(parties):
        alone = np.eye(parties)[p]
        solution = np.linalg.lstsq(indicators.T, alone, rcond=None)[0]
        assert np.abs(indicators.T @ solution - alone).max() > 0.1


def test_kcagc_refuses_a_key_relay_without_every_client(tmp_path, caplog):
    """The peers' keys travel with kcagc's first step after hello, ``kcagc_local``."""
    def drop_party_2(partition, arrays, values):
        return arrays, {k: v for k, v in values.items() if k != SECAGG_PEER + "2"}

    raw = {**MASKING_RUNS["kcagc"][0], "strategy": "kcagc", "num-clients": 3}
    with refused(caplog, r"rule 'masking-group'", r"rule 'masking-group': keys relayed for parties \[0, 1\]; this "
                                                   r"client masks only with every client of the run, \[0, 1, 2\]"):
        run(raw, tmp_path, MaliciousServerGrid, action="kcagc_local", rewrite=drop_party_2)


# --------------------------------------------------------------------------- bound probes
@pytest.mark.parametrize("factor", [0.5, 1.0, 1e3])
def test_a_bound_probe_gets_the_same_answer_whatever_the_private_value(factor, tmp_path):
    """A client that refused a value above the server's secagg_bound and answered below it would let
    a bisection of the bound read a statistic (to 9 digits in 40 requests). A bound below the one
    the step declares honestly (fedkmeans: the client's rows x the run's secagg.bound) is refused
    by every client, whatever its data; from it up, every client answers (values beyond the bound
    clipped), whatever its data."""
    def probe(partition, arrays, values):
        return arrays, {**values, "secagg_bound": values["secagg_bound"] * factor}

    answers = []
    for signal in (0.5, 50.0):  # two private datasets, statistics far apart
        raw = {**MASKING_RUNS["fedkmeans"][0], "sbm.signal": signal, "secagg.bound": 10.0, "strategy": "fedkmeans",
               "num-clients": 3, "out-dir": str(tmp_path / f"signal-{signal}")}
        grid = MaliciousServerGrid(build_client_app(raw), 3, record=True, action="kmeans_step", rewrite=probe)
        if factor < 1:
            with pytest.raises(ProtocolError):  # refused by the clients
                run_server(grid, raw)
        else:  # answered; a bound above the server's own may decode beyond it, which stops the run
            with contextlib.suppress(ProtocolError):
                run_server(grid, raw)
        first = [m for m in grid.pulled if m.metadata.message_type == "query.kmeans_step"][:3]
        answers.append(["refused" if refused_rule(m.content) == "secagg-bound" else "answer" for m in first])
    expected = ["answer" if factor >= 1 else "refused"] * 3
    assert answers == [expected, expected]


def test_values_beyond_the_bound_are_clipped_not_refused():
    config = validate({"strategy": "fedkmeans"})
    clients = [FedKMeansClient(SimpleNamespace(num_clients=2, client_id=i), config,
                               Context(run_id=1, node_id=i, node_config={}, state=RecordDict(), run_config={}))
               for i in range(2)]
    keys = {i: c.on_secagg_setup({}, {"session_id": "s"})[1]["public_key"] for i, c in enumerate(clients)}
    for c in clients:
        c.on_secagg_agree({}, pack_id_bytes(keys))
    bound = float(config["secagg.bound"])
    values = {"secagg_tag": "1:stats", "secagg_scale": 2.0**10, "secagg_bound": bound, "secagg_parties": 2}
    private = [np.array([3 * bound, -0.5]), np.array([0.25, -5 * bound])]
    masked = {i: c.masked(x, values) for i, (c, x) in enumerate(zip(clients, private))}
    total = unmask_sum(masked, [0, 1], FixedPointEncoder(2.0**10, bound, 2))
    assert np.array_equal(total, [bound + 0.25, -0.5 - bound])
    with pytest.raises(PrivacyRefusal, match=r"rule 'secagg-bound': secagg_bound=10 for '2:stats', below 1e\+06"):
        clients[0].masked(private[0], {**values, "secagg_tag": "2:stats", "secagg_bound": 10.0})


# --------------------------------------------------------------------------- noise floors from the node
def test_the_node_config_noise_floor_holds_whatever_the_run_config_says(tmp_path, caplog):
    """A SuperNode's --node-config noise-multiplier=5 holds: the run-config cannot lower it."""
    raw = {**SBM, "strategy": "fedspectral-plus", "dataset": "sbm", "num-clients": 2, "fedspectral-plus.mode": "paper",
           "fedspectral-plus.rounds": 2}
    floor = {"fedspectral-plus.noise-multiplier": 5.0}
    with refused(caplog, r"rule 'noise-multiplier'$",
                 r"rule 'noise-multiplier': 'fedspectral_power' was requested with no noise; this client needs at "
                 r"least 5 \(its node's noise-multiplier 5, its run's 0\)") as err:
        run(raw, tmp_path, configs=node_configs(2, **floor))
    assert refusal(err) == {0: "noise-multiplier", 1: "noise-multiplier"}
    with refused(caplog, r"rule 'noise-multiplier'$", r"was requested with noise multiplier [\d.]+; this client needs "
                                                       r"at least 5"):
        run({**raw, "fedspectral-plus.noise-multiplier": 2.0}, tmp_path, configs=node_configs(2, **floor))
    result = run({**raw, "fedspectral-plus.noise-multiplier": 5.0}, tmp_path, configs=node_configs(2, **floor))
    assert 0 < result["privacy"]["epsilon"] < float("inf")


def test_fedsc_and_fedavg_dmon_noise_floors(tmp_path, caplog):
    fedsc = {"strategy": "fedsc", "dataset": "iris", "num-clients": 2, "num-rounds": 2, "fedsc.sigma": 2.5,
             "fedsc.landmarks": 10, "reference": False}
    with refused(caplog, r"rule 'noise-multiplier'$", r"rule 'noise-multiplier': 'fedsc_round' was requested with no "
                                                       r"noise"):
        run(fedsc, tmp_path, configs=node_configs(2, **{"fedsc.noise-multiplier": 1.0}))
    run({**fedsc, "fedsc.dp-epsilon": 1.0}, tmp_path, configs=node_configs(2, **{"fedsc.noise-multiplier": 1.0}))
    dmon = {**MASKING_RUNS["fedavg-dmon"][0], "fedavg-dmon.secure": False, "strategy": "fedavg-dmon",
            "num-clients": 2, "fedavg-dmon.dp-clip": 1.0, "fedavg-dmon.dp-noise": 0.5, "partition.boundary": False}
    with refused(caplog, r"rule 'noise-multiplier'$", r"rule 'noise-multiplier': 'dmon_train' was requested with "
                                                       r"noise multiplier 0.5; this client needs at least 0.8"):
        run(dmon, tmp_path, configs=node_configs(2, **{"fedavg-dmon.noise-multiplier": 0.8}))


# --------------------------------------------------------------------------- what may leave at all
def identity_block(partition, arrays, values):
    n = arrays["block"].shape[0]
    return {**arrays, "block": np.eye(n)}, values


def test_fedspectral_plus_refuses_an_identity_block(tmp_path, caplog):
    """An answer to ``block = I`` would be the client's whole private edge set (258 of 258 edges)."""
    raw = {**SBM, "strategy": "fedspectral-plus", "dataset": "sbm", "num-clients": 2,
           "fedspectral-plus.mode": "exact", "fedspectral-plus.rounds": 3}
    with refused(caplog, r"rule 'min-block-support'$", r"rule 'min-block-support': 'fedspectral_product' block "
                                                        r"column 0 spreads over 1 node\(s\) .*below this node's "
                                                        r"min-block-support=4") as e:
        run(raw, tmp_path, MaliciousServerGrid, action="fedspectral_product", rewrite=identity_block)
    assert refusal(e) == {0: "min-block-support", 1: "min-block-support"}
    # the attack itself, on a node that lowers the rule to 1: its reply is its edge set
    open_raw = {**raw, "out-dir": str(tmp_path / "open")}
    grid = MaliciousServerGrid(build_client_app(open_raw), 2, node_configs(2, **{"fedspectral-plus.min-block-support": 1}),
                               record=True, action="fedspectral_product", rewrite=identity_block)
    with pytest.raises(ProtocolError, match=r"array 'block' has shape \(200, 200\), expected \(200, 8\)"):
        run_server(grid, open_raw)
    reply = next(unpack(m.content)[0]["block"] for m in grid.pulled
                 if m.metadata.message_type == "query.fedspectral_product" and m.metadata.src_node_id == 1001)
    config = validate(raw).as_dict()
    shard = client_shard(dataset="sbm", partitioner="edge", partition_id=0, num_partitions=2, seed=0,
                         data_root=None, dataset_kwargs=dataset_kwargs(config),
                         partition_kwargs=partition_kwargs("edge", config))
    assert np.array_equal(reply > 0, shard.adj.toarray() > 0)


def test_honest_blocks_pass_the_default_support_rule(tmp_path):
    for mode in ("exact", "paper"):
        raw = {**SBM, "strategy": "fedspectral-plus", "dataset": "karate", "num-clients": 2,
               "fedspectral-plus.mode": mode}
        assert run(raw, tmp_path)["metrics"]["ari"] > 0.2


# --------------------------------------------------------------------------- budget over runs and restarts
FEDSC_DP = {"strategy": "fedsc", "dataset": "iris", "num-clients": 2, "num-rounds": 3, "fedsc.sigma": 2.5,
            "fedsc.landmarks": 10, "fedsc.dp-epsilon": 2.0, "reference": False}


def test_the_budget_survives_runs_and_restarts(tmp_path, caplog):
    """fedsc's release budget lives in the node's ledger, not the run: a new run or a restarted
    SuperNode does not allow as many releases again."""
    ledgers = [tmp_path / f"node-{i}.jsonl" for i in range(2)]
    configs = [{**c, "privacy-ledger": str(ledgers[i]), "privacy.fedsc.epsilon": 1.5}
               for i, c in enumerate(node_configs(2))]
    first = run(FEDSC_DP, tmp_path, configs=configs)  # a fresh grid: new run, fresh contexts (a restart)
    records = [json.loads(line) for line in ledgers[0].read_text().splitlines()]
    assert [r["action"] for r in records] == ["fedsc_round"] * 3 + ["fedsc_final"]
    spent = composed_epsilon([r["noise_multiplier"] for r in records], 1e-5)
    # RDP over all four releases (1.395): at most the run's own sum of its two halves (1.989)
    assert spent == pytest.approx(1.3954, abs=1e-4) and spent < first["privacy"]["epsilon"] <= 2.0
    with refused(caplog, r"^step 'fedsc_round' refused by the privacy policy of client 0 \(node 1001\), rule "
                         r"'epsilon'; ",
                 r"rule 'epsilon': fedsc_round \(noise multiplier .*\) after 4 earlier release\(s\) would bring this "
                 r"node's fedsc epsilon to 1.518 at delta 1e-05, above its budget 1.5 "
                 r"\(ledger .*node-0.jsonl\)") as err:
        run(FEDSC_DP, tmp_path, configs=configs)
    assert refusal(err) == {0: "epsilon", 1: "epsilon"}
    assert len(ledgers[0].read_text().splitlines()) == 4  # the refused release left no record


def test_a_restarted_node_continues_its_runs_release_count(tmp_path):
    config = validate(FEDSC_DP)
    ledger = tmp_path / "ledger.jsonl"

    def node(state: RecordDict) -> FedSCClient:
        return FedSCClient(None, config, Context(run_id=7, node_id=1, node_config={"privacy-ledger": str(ledger)},
                                                 state=state, run_config={}))

    client = node(RecordDict())
    for r in (1, 2, 2):  # the second sent twice (a retry): the kept reply, no new release
        client.release("fedsc_round", {}, {"round": r}, lambda: {"update": np.zeros(2)}, multiplier=1.0, most=3)
    restarted = node(RecordDict())  # context state lost, ledger kept
    restarted.release("fedsc_round", {}, {"round": 3}, lambda: {"update": np.zeros(2)}, multiplier=1.0, most=3)
    with pytest.raises(PrivacyRefusal, match=r"rule 'releases': release 4 of fedsc_round in run 7: this client's "
                                             r"privacy budget for the run covers 3"):
        restarted.release("fedsc_round", {}, {"round": 4}, lambda: {"update": np.zeros(2)}, multiplier=1.0, most=3)
    assert len(NodeLedger(ledger, RecordDict()).records()) == 3


def test_a_tampered_ledger_stops_with_file_and_line(tmp_path):
    ledger = tmp_path / "ledger.jsonl"
    ledger.write_text('{"time": "t", "run": 1, "strategy": "fedsc", "action": "a", "request": "r", '
                      '"noise_multiplier": null}\nnot json\n')
    with pytest.raises(ConfigError, match=rf"^privacy ledger {ledger}, line 2, column 1: Expecting value$"):
        NodeLedger(ledger, RecordDict()).records()


def test_composed_epsilon():
    assert composed_epsilon([], 1e-5) == 0.0 and composed_epsilon([1.0, None], 1e-5) == float("inf")
    from opacus.accountants import RDPAccountant

    accountant = RDPAccountant()
    for z in (1.0, 1.0, 2.0):
        accountant.step(noise_multiplier=z, sample_rate=1.0)
    assert composed_epsilon([1.0, 2.0, 1.0], 1e-5) == pytest.approx(accountant.get_epsilon(delta=1e-5))


def test_a_refusal_travels_as_a_reply_naming_its_rule_not_as_error_text():
    """The server tells a refusal from a failure by the reply's record, never by reading error
    text: an error whose text looks like a refusal is a client error, and a refusal reply carries
    the rule and nothing of what the policy saw."""
    from flwr.app import Error, Message

    from fedgraphcore.transport import REFUSAL, Exchange, _checked_replies, refusal

    asked = [Message(RecordDict(), dst_node_id=n, message_type="query.fedsc_round") for n in (1, 2)]
    for m, i in zip(asked, "ab"):
        m.metadata.__dict__["_message_id"] = i
    refused = Message(refusal("epsilon"), reply_to=asked[0])
    looks_alike = Message(Error(0, f"{PrivacyRefusal.MARKER}, rule 'epsilon'"), reply_to=asked[1])
    outcome = _checked_replies(asked, [refused, looks_alike], None)
    assert isinstance(outcome, Exchange) and outcome.refusals == {1: "epsilon"}
    assert outcome.rejected[2].startswith("client error: ") and 2 not in outcome.refusals
    assert list(refused.content.config_records) == [REFUSAL] and dict(refused.content[REFUSAL]) == {"rule": "epsilon"}
    assert refused_rule(RecordDict()) is None
