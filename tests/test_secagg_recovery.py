"""Secure sums that survive a dropout: double masking, the parties' refusals, a server asking
wrongly, and runs (in-process and deployed) where a client drops between masking and unmasking."""

from __future__ import annotations

import json
import threading

import numpy as np
import pytest

from app.client_app import build_client_app
from app.inprocess import FIRST_CLIENT_NODE_ID, InProcessGrid
from fedgraphcore.privacy.secagg import FixedPointEncoder, SecAggDropoutError, SecAggError, SecAggParty, relay_public_keys
from fedgraphcore.privacy.secagg import sum_masked
from fedgraphcore.privacy.secagg_recovery import (SEALED_SHARE_BYTES, check_threshold, inbox, inbox_shares, mask_recoverable,
                                         recover_sum, recovery_threshold, sealed_rows, unmask_response)
from app.server_app import run_server
from fedgraphcore.transport import pack, unpack
from fedgraphcore.wire import SECAGG_SHARES, SECAGG_UNMASK
from conftest import LateReplyGrid, LeavingGrid, RestartingGrid, wait_until


def make_parties(n: int, session: str = "recovery"):
    parties = [SecAggParty.generate(i, session) for i in range(n)]
    keys = relay_public_keys({p.party_id: p.public_key_bytes() for p in parties})
    for p in parties:
        p.agree(keys)
    return parties


def masked_round(parties, xs, tag, enc, threshold, participants=None):
    """Every party's recoverable upload of ``tag``: (uploads, sealed shares by sender)."""
    ups, sealed = {}, {}
    for p in parties:
        ups[p.party_id], sealed[p.party_id] = mask_recoverable(p, xs[p.party_id], tag, enc, threshold, participants)
    return ups, sealed


def answers(parties, sealed, tag, survivors, dropped, size, enc, answering=None):
    """The unmask answers of the survivors in ``answering`` (default: every survivor)."""
    out = {}
    for p in parties:
        if p.party_id in (survivors if answering is None else answering):
            mine = {u: sealed[u][p.party_id] for u in survivors if u != p.party_id}
            out[p.party_id] = unmask_response(p, tag, survivors, dropped, mine, size if dropped else 0, enc)
    return out


def integer_inputs(n: int, enc: FixedPointEncoder, shape=(5, 3), seed: int = 0):
    """Inputs on the encoder's grid (multiples of 1/scale), so that the plain sum is exact."""
    rng = np.random.default_rng(seed)
    return {i: rng.integers(-1000, 1000, shape) / enc.scale for i in range(n)}


@pytest.mark.parametrize("n, dropped", [(3, []), (3, [1]), (5, [0, 3]), (7, [6]), (7, [1, 2, 4])])
def test_the_recovered_sum_is_exactly_the_survivors_plain_sum(n, dropped):
    enc = FixedPointEncoder(2.0**12, 1.0, n)
    parties = make_parties(n)
    xs = integer_inputs(n, enc, seed=n)
    ups, sealed = masked_round(parties, xs, "t1", enc, recovery_threshold(n))
    survivors = [i for i in range(n) if i not in dropped]
    resp = answers(parties, sealed, "t1", survivors, dropped, ups[0].size, enc)
    total = recover_sum({u: ups[u] for u in survivors}, range(n), enc, resp, recovery_threshold(n), "t1")
    plain = enc.decode(sum_masked([enc.encode(xs[u]) for u in survivors]))  # the survivors' sum in the ring
    assert np.array_equal(total, plain)
    assert np.array_equal(total, np.sum([xs[u] for u in survivors], axis=0))
    # the uploads alone: masks that do not cancel (the self masks stay whoever dropped)
    assert not np.array_equal(enc.decode(sum_masked([ups[u] for u in survivors])), plain)


def test_without_a_dropout_any_threshold_of_answers_suffices():
    n, t = 5, recovery_threshold(5)
    enc = FixedPointEncoder(2.0**12, 1.0, n)
    parties = make_parties(n)
    xs = integer_inputs(n, enc)
    ups, sealed = masked_round(parties, xs, "t1", enc, t)
    resp = answers(parties, sealed, "t1", list(range(n)), [], ups[0].size, enc, answering=[1, 2, 4])
    total = recover_sum(ups, range(n), enc, resp, t, "t1")
    assert np.array_equal(total, np.sum(list(xs.values()), axis=0))


def test_a_sum_among_the_parties_left_cancels_without_the_others():
    enc = FixedPointEncoder(2.0**12, 1.0, 5)
    parties = make_parties(5)
    xs = integer_inputs(5, enc)
    left = [0, 2, 3]
    ups, sealed = masked_round([parties[i] for i in left], xs, "t2", enc, 2, participants=left)
    resp = answers([parties[i] for i in left], sealed, "t2", left, [], ups[0].size, enc)
    assert np.array_equal(recover_sum(ups, left, enc, resp, 2, "t2"), np.sum([xs[i] for i in left], axis=0))


def test_a_late_upload_of_a_dropped_party_stays_hidden_by_its_self_mask():
    enc = FixedPointEncoder(2.0**12, 1.0, 4)
    parties = make_parties(4)
    xs = {i: np.full(4096, 0.25 * i) for i in range(4)}
    ups, sealed = masked_round(parties, xs, "t1", enc, 3)
    resp = answers(parties, sealed, "t1", [0, 1, 2], [3], 4096, enc)
    pairs_removed = ups[3].copy()
    for v in (0, 1, 2):
        np.add(pairs_removed, resp[v][1], out=pairs_removed)  # the server knows every pair mask of party 3
    assert np.mean(pairs_removed == enc.encode(xs[3])) < 0.01  # what is left: its self mask


def test_a_party_refuses_to_reveal_both_kinds_of_share_for_one_party():
    enc = FixedPointEncoder(2.0**12, 1.0, 4)
    parties = make_parties(4)
    ups, sealed = masked_round(parties, integer_inputs(4, enc), "t1", enc, 3)
    p0 = parties[0]
    # the server names party 3 dropped: party 0 gives its pair masks with 3
    answers([p0], sealed, "t1", [0, 1, 2], [3], ups[0].size, enc)
    # ... then a survivor: a share of 3's self mask would unmask its late upload
    with pytest.raises(SecAggError, match=r"gave its pair masks for party 3 and refuses a share of its self mask"):
        answers([p0], sealed, "t1", [0, 1, 2, 3], [], ups[0].size, enc)
    # the other way round, on another party: 1 a survivor first, then named dropped
    p2 = parties[2]
    answers([p2], sealed, "t1", [0, 1, 2, 3], [], ups[0].size, enc)
    with pytest.raises(SecAggError, match=r"gave a share of its self mask for party 1 and refuses its pair masks"):
        answers([p2], sealed, "t1", [0, 2, 3], [1], ups[0].size, enc)
    # the refusal survives the state's round trip through context.state
    again = SecAggParty.from_array(p0.to_array())
    with pytest.raises(SecAggError, match="different dropout set"):
        answers([again], sealed, "t1", [0, 1, 2, 3], [], ups[0].size, enc)
    # the same split again (a retried request) gets the same answer
    first = answers([again], sealed, "t1", [0, 1, 2], [3], ups[0].size, enc)[0]
    assert np.array_equal(first[1], answers([p0], sealed, "t1", [0, 1, 2], [3], ups[0].size, enc)[0][1])


def test_a_server_asking_too_few_or_the_wrong_shares_fails_cleanly():
    n, t = 5, 3
    enc = FixedPointEncoder(2.0**12, 1.0, n)
    parties = make_parties(n)
    xs = integer_inputs(n, enc)
    ups, sealed = masked_round(parties, xs, "t1", enc, t)
    size = ups[0].size
    survivors = [0, 1, 2, 3]
    # a party refuses a split that leaves fewer survivors than the threshold, or that is not the sum's parties
    with pytest.raises(SecAggError, match="2 survivors of tag 't1', below the threshold 3"):
        answers(parties[:1], sealed, "t1", [0, 1], [2, 3, 4], size, enc)
    with pytest.raises(SecAggError, match=r"exactly the parties of the sum \[0, 1, 2, 3, 4\]"):
        answers(parties[:1], sealed, "t1", [0, 1, 2], [3], size, enc)
    with pytest.raises(SecAggError, match="made no recoverable upload under tag 'other'"):
        unmask_response(parties[0], "other", survivors, [4], {}, size, enc)
    resp = answers(parties, sealed, "t1", survivors, [4], size, enc)
    # fewer answers than the threshold
    with pytest.raises(SecAggDropoutError, match="only 2 unmask responses, threshold 3"):
        recover_sum({u: ups[u] for u in survivors}, range(n), enc, {u: resp[u] for u in (0, 1)}, t, "t1")
    # a dropout needs every survivor's pair masks with the dropped party
    with pytest.raises(SecAggDropoutError, match=r"survivors must all answer.*\[4\]"):
        recover_sum({u: ups[u] for u in survivors}, range(n), enc, {u: resp[u] for u in (0, 1, 2)}, t, "t1")
    # the wrong shares (another survivor's), a threshold below the parties' one: the sum is refused
    swapped = {v: ({**shares, 0: shares[1]}, corr) for v, (shares, corr) in resp.items()}
    with pytest.raises(SecAggError, match="beyond 4 x the declared bound"):
        recover_sum({u: ups[u] for u in survivors}, range(n), enc, swapped, t, "t1")
    with pytest.raises(SecAggError, match="beyond 4 x the declared bound"):
        recover_sum({u: ups[u] for u in survivors}, range(n), enc, resp, 2, "t1")
    # a sealed share altered on the way fails authentication
    fresh = make_parties(n, "other-session")
    ups2, sealed2 = masked_round(fresh, xs, "t2", enc, t)
    bad = bytearray(sealed2[1][0])
    bad[20] ^= 1
    with pytest.raises(SecAggError, match="share ciphertext from party 1 failed authentication"):
        unmask_response(fresh[0], "t2", range(n), [], {**{u: sealed2[u][0] for u in range(1, n)}, 1: bytes(bad)},
                                 0, enc)


@pytest.mark.parametrize("threshold, parties", [(1, 5), (2, 5), (6, 5), (2.5, 5), (1, 2)])
def test_a_threshold_below_a_majority_or_above_the_parties_is_refused(threshold, parties):
    with pytest.raises(SecAggError, match=f"threshold={threshold} for a sum among {parties} parties; valid"):
        check_threshold(threshold, parties)
    enc = FixedPointEncoder(2.0**12, 1.0, 5)
    party = make_parties(parties)[0]
    with pytest.raises(SecAggError, match="valid"):
        mask_recoverable(party, np.zeros(3), "t", enc, threshold)
    assert "t" not in party.recovery  # refused before masking: the tag stays unused
    mask_recoverable(party, np.zeros(3), "t", enc, recovery_threshold(parties))


def test_sealed_shares_travel_as_rows_and_reach_only_their_party():
    enc = FixedPointEncoder(2.0**12, 1.0, 3)
    parties = make_parties(3)
    _, sealed = masked_round(parties, integer_inputs(3, enc), "t1", enc, 2)
    rows = {u: sealed_rows(sealed[u], 3) for u in range(3)}
    assert rows[0].shape == (3, SEALED_SHARE_BYTES) and not rows[0][0].any()  # its own row stays empty
    box = inbox(rows, 1, [0, 1, 2])
    assert inbox_shares(box, [0, 1, 2], 1) == {0: sealed[0][1], 2: sealed[2][1]}
    with pytest.raises(SecAggError, match="uint8 rows of 60 bytes"):
        inbox_shares(box[:, :59], [0, 2], 1)
    with pytest.raises(SecAggError, match="outside the inbox's 3 rows"):
        inbox_shares(box, [0, 7], 1)


# ---------------------------------------------------------------------------------------------- runs
class MaskThenLeaveGrid(InProcessGrid):
    """The last node answers the ``leave_at``-th ``action`` step (it masks and keeps its state), then
    its SuperNode is gone before the reply reaches the server: dropped between masking and unmasking."""

    def __init__(self, *args, leave_at: int, action: str, category: str = "query", **kwargs):
        super().__init__(*args, **kwargs)
        self.leave_at, self.action, self.rounds, self.masked_by_leaver = leave_at, f"{category}.{action}", 0, None

    def push_messages(self, messages):
        messages = list(messages)
        ids = super().push_messages(messages)
        if messages and messages[0].metadata.message_type == self.action:
            self.rounds += 1
            if self.rounds == self.leave_at:
                node = max(self.contexts)
                self.dropped.add(node)
                lost = [i for i, m in zip(ids, messages) if m.metadata.dst_node_id == node]
                self.masked_by_leaver = self._replies.pop(lost[0]).content  # answered, never delivered
        return ids


FEDSC = {"strategy": "fedsc", "dataset": "iris", "num-clients": 4, "num-rounds": 5, "min-clients": 3,
         "fedsc.landmarks": 30, "timeout": 30.0, "reference": False, "secagg.scale": 2.0**30}


def test_a_client_dropping_between_masking_and_unmasking_leaves_the_survivors_result(tmp_path):
    """fedsc under secure aggregation, client 3 gone after masking round 3: the run ends with the
    landmarks of the same run without masks where client 3 left before round 3."""
    raw = {**FEDSC, "fedsc.secure": True, "out-dir": str(tmp_path / "secure")}
    grid = MaskThenLeaveGrid(build_client_app(raw), 4, leave_at=3, action="fedsc_round")
    secure = run_server(grid, raw)
    assert {"update", SECAGG_SHARES} <= set(unpack(grid.masked_by_leaver)[0])  # it masked; the server never saw it
    plain_raw = {**FEDSC, "out-dir": str(tmp_path / "plain")}
    plain = run_server(LeavingGrid(build_client_app(plain_raw), 4, leave_at=3, action="fedsc_round"), plain_raw)
    assert [d["client"] for d in secure["communication"]["dropped"]] == [3]
    # the same landmarks up to the fixed-point resolution: the same objectives, the same labels
    assert [h["objective"] for h in secure["history"]] == pytest.approx([h["objective"] for h in plain["history"]],
                                                                        rel=1e-6)
    assert np.array_equal(np.load(tmp_path / "secure" / "labels.npy"), np.load(tmp_path / "plain" / "labels.npy"))
    unmasks = [r for r in secure["timing"]["per_round"] if r["action"] == SECAGG_UNMASK]
    assert [r["replies"] for r in unmasks] == [4, 4, 3, 3, 3]  # one unmask round per sum, by its survivors
    [entry] = [m for m in secure["privacy"]["mechanisms"] if m["name"] == "secure-aggregation:dropout-recovery"]
    assert entry["params"]["recovered"] == [{"tag": entry["params"]["recovered"][0]["tag"],
                                             "survivors": [0, 1, 2], "dropped": [3]}]


def test_a_kept_noised_reply_re_sent_goes_with_its_sealed_shares(tmp_path):
    """fedsc's noised Z_p is one release: the request sent again after a timeout gets the kept
    masked reply back, with the shares sealed when it was masked, and the sum is over all three."""
    raw = {"strategy": "fedsc", "dataset": "iris", "num-clients": 3, "num-rounds": 2, "fedsc.noise-z": 0.3,
           "fedsc.landmarks": 8, "fedsc.secure": True, "retries": 1, "timeout": 0.5, "reference": False,
           "out-dir": str(tmp_path)}
    grid = LateReplyGrid(build_client_app(raw), 3, record=True, node=FIRST_CLIENT_NODE_ID + 1, action="fedsc_round")
    result = run_server(grid, raw)
    late = unpack(grid.late[0].content)[0]
    again = next(unpack(r.content)[0] for r in grid.pulled if r.metadata.message_type == "query.fedsc_round"
                 and r.metadata.src_node_id == FIRST_CLIENT_NODE_ID + 1)
    assert late.keys() == again.keys() == {"update", SECAGG_SHARES}
    assert all(np.array_equal(late[k], again[k]) for k in late)
    assert result["communication"]["dropped"] == [] and result["communication"]["secure_aggregations"] == 2


@pytest.mark.slow
def test_fedavg_dmon_averages_the_weights_of_the_clients_that_answered(tmp_path):
    """Secure FedAvg with client 2 gone after masking round 2 gives the model of the run without
    masks where client 2 left before round 2: the survivors' rows weigh the average."""
    raw = {"strategy": "fedavg-dmon", "dataset": "karate", "num-clusters": 2, "partitioner": "node-random",
           "num-clients": 3, "num-rounds": 3, "min-clients": 2, "reference": False, "fedavg-dmon.local-epochs": 2,
           "fedavg-dmon.hidden": 4, "partition.boundary": False, "fedavg-dmon.select": "last",
           "secagg.scale": 2.0**30, "secagg.bound": 1e3}
    secure_raw = {**raw, "fedavg-dmon.secure": True, "out-dir": str(tmp_path / "secure")}
    grid = MaskThenLeaveGrid(build_client_app(secure_raw), 3, leave_at=2, action="dmon_train", category="train")
    secure = run_server(grid, secure_raw)
    plain_raw = {**raw, "out-dir": str(tmp_path / "plain")}
    plain = run_server(RestartingGrid(build_client_app(plain_raw), 3, leave_at=2, back_at=0, action="dmon_train",
                                      category="train"), plain_raw)
    assert [h["excluded"] for h in secure["history"]] == [h["excluded"] for h in plain["history"]] == [[], [2], []]
    for s, p in zip(secure["history"], plain["history"]):
        assert s["val_modularity"] == pytest.approx(p["val_modularity"], abs=1e-6)
    assert np.array_equal(np.load(tmp_path / "secure" / "labels.npy"), np.load(tmp_path / "plain" / "labels.npy"))


def test_fedkmeans_goes_on_without_a_client_that_dropped_after_masking(tmp_path):
    raw = {"strategy": "fedkmeans", "dataset": "iris", "num-clients": 4, "num-rounds": 4, "min-clients": 2,
           "fedkmeans.secure": True, "fedkmeans.tol": 0.0, "timeout": 30.0, "reference": False,
           "out-dir": str(tmp_path)}
    grid = MaskThenLeaveGrid(build_client_app(raw), 4, leave_at=2, action="kmeans_step")
    result = run_server(grid, raw)
    assert [d["client"] for d in result["communication"]["dropped"]] == [3]
    # Lloyd rounds past the dropout, each sum's cluster sizes checked against the survivors' rows
    assert len(result["history"]) >= 3 and result["communication"]["secure_aggregations"] == len(result["history"])
    labels = np.load(tmp_path / "labels.npy")
    assert 0.6 < (labels >= 0).mean() < 0.9  # the dropped client's rows have no label


def test_a_server_asking_a_client_for_both_kinds_of_share_is_refused(tmp_path, monkeypatch):
    """The attack through Flower: after an honest unmask round, the server asks again naming
    survivor 2 dropped (its pair masks would unmask the upload whose self mask it just rebuilt)."""
    from fedgraphcore.session import PrivacyRefused, ServerSession

    honest = ServerSession.exchange

    def greedy(self, action, contents, expect=None, **kwargs):
        replies = honest(self, action, contents, expect, **kwargs)
        if action == SECAGG_UNMASK:
            again = {node: pack(unpack(c)[0], {**unpack(c)[1], "secagg_survivors": [0, 1, 3], "secagg_dropped": [2]})
                     for node, c in contents.items() if self.partition_of(node) != 2}
            honest(self, action, again)
        return replies

    monkeypatch.setattr(ServerSession, "exchange", greedy)
    raw = {"strategy": "fedkmeans", "dataset": "iris", "num-clients": 4, "num-rounds": 2, "min-clients": 2,
           "fedkmeans.secure": True, "reference": False, "out-dir": str(tmp_path)}
    with pytest.raises(PrivacyRefused, match=r"step 'secagg_unmask' refused .* rule 'secagg-unmask'") as refused:
        run_server(InProcessGrid(build_client_app(raw), 4), raw)
    assert sorted(refused.value.refusals) == [0, 1, 3]  # every party asked; the rule only goes to the server
    assert not (tmp_path / "result.json").exists()


def test_a_strategy_that_needs_every_party_says_so():
    """A sum that cannot be recovered stops on a dropout naming the strategy's need."""
    from app import registry
    from fedgraphcore.session import ClientInfo, ServerSession

    session = ServerSession(None, registry.validate({"strategy": "kcagc", "num-clients": 3}))
    session.clients = [ClientInfo(1000 + i, i, {}, {}) for i in range(3)]
    session._order = {1000 + i: i for i in range(3)}
    session._secagg_ready = True
    values = session.secagg_values("d", 4.0, recover=False)
    enc = FixedPointEncoder(values["secagg_scale"], values["secagg_bound"], values["secagg_parties"])
    parties = make_parties(3)
    replies = {1000 + i: pack({"d": parties[i].mask(np.ones(2), values["secagg_tag"], enc)}) for i in (0, 1)}
    with pytest.raises(SecAggDropoutError, match=r"party id\(s\) \[2\] \(strategy kcagc needs every party's upload"):
        session.secure_sum(replies, "d", values)


@pytest.mark.slow
@pytest.mark.deployment
def test_a_deployed_run_goes_on_after_a_supernode_is_killed_between_masking_and_unmasking(tmp_path):
    """fedkmeans secure, 3 SuperNodes: supernode-1 is killed as soon as it gets the first Lloyd step
    (the masked one); the run ends with the other two, the sum recovered."""
    from conftest import RUN_GUARD_S
    from test_deployment import _run_with_fault, _small_federation_files

    out = tmp_path / "run"
    config = _small_federation_files(out, 3, "node-random", "fedkmeans",
                                     {"num-rounds": 3, "fedkmeans.secure": True, "fedkmeans.tol": 0.0,
                                      "min-clients": 2})
    killed = threading.Event()

    def kill_when_masking(federation):
        wait_until(lambda: "ROUND 2]" in federation.log("supernode-1"), "supernode-1 to get the masked step",
                   RUN_GUARD_S)
        federation.kill("supernode-1")
        killed.set()

    proc, federation = _run_with_fault(out, config, kill_when_masking)
    report = (proc.stdout + proc.stderr)[-3000:]
    assert killed.is_set(), report
    result = json.loads((out / "result" / "result.json").read_text())
    [gone] = result["communication"]["dropped"]
    assert gone["client"] == 1, report
    assert any(r["action"] == SECAGG_UNMASK for r in result["timing"]["per_round"]), report
    [entry] = [m for m in result["privacy"]["mechanisms"] if m["name"] == "secure-aggregation:dropout-recovery"]
    if gone["action"] == "kmeans_step":  # killed before its masked reply left: that sum went on without it
        assert entry["params"]["recovered"] == [{"tag": "2:stats", "survivors": [0, 2], "dropped": [1]}], report
    else:  # its masked reply left before the kill: the unmask round went on with the others' shares
        assert gone["action"] == SECAGG_UNMASK and entry["params"]["recovered"] == [], report
