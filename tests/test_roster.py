"""An active server against the members' secure aggregation: keys it substitutes or swaps, sybils it
registers, survivor sets it splits. Each attack runs the real ServerApp and ClientApps in-process;
the attacker is the server (its relay, its unmask round) and, where it says so, a node of its
own. Every member holds an identity key and the federation's roster in its node config
(:mod:`fedgraphcore.privacy.roster`)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import yaml
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

from app.client_app import build_client_app
from app.inprocess import FIRST_CLIENT_NODE_ID, InProcessGrid
from fedgraphcore.privacy.secagg import FixedPointEncoder, SecAggParty
from fedgraphcore.privacy.secagg_recovery import self_mask, shamir_reconstruct, share_x
from fedgraphcore.secure_session import SecureAggregation
from app.server_app import run_server
from fedgraphcore.session import PrivacyRefused, ServerSession
from fedgraphcore.transport import pack, unpack
from fedgraphcore.wire import (SECAGG_CONSISTENCY, SECAGG_ENDORSED, SECAGG_INBOX, SECAGG_PEER, SECAGG_SIGNED, SECAGG_UNMASK,
                      SURVIVOR_SIGNATURE, ProtocolError)
from clients.base import ClusteringClient

CLIENTS = 3
#: fedkmeans with every Lloyd statistic masked; min-clients 3: the one-round sum (pair masks only)
RUN = {"strategy": "fedkmeans", "dataset": "sbm", "sbm.nodes": 60, "sbm.features": 4, "sbm.blocks": 3,
       "num-clusters": 3, "num-clients": CLIENTS, "min-clients": CLIENTS, "fedkmeans.secure": True,
       "reference": False, "seed": 3, "num-rounds": 3}
#: the same with dropout recovery (min-clients 2 of 3: a majority threshold of 2, one more round)
RECOVERING = {**RUN, "min-clients": 2}


def identity(folder: Path, name: str) -> tuple[Path, str]:
    """An Ed25519 identity key ``folder/name`` (OpenSSH, as ``python -m deploy keygen`` writes it) and
    its public key line."""
    key = Ed25519PrivateKey.generate()
    path = folder / name
    path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH,
                                       serialization.NoEncryption()))
    return path, key.public_key().public_bytes(serialization.Encoding.OpenSSH,
                                               serialization.PublicFormat.OpenSSH).decode()


def member_configs(tmp_path: Path, listed: int = CLIENTS, policy: dict | None = None,
                   nodes: int = CLIENTS) -> list[dict]:
    """Node configs of the run's ``nodes``: each its partition, an identity key; nodes ``0 .. listed - 1``
    are the members (the roster lists them, and they hold it), the rest the operator's own
    (an identity key, no roster)."""
    folder = tmp_path / "identities"
    folder.mkdir(exist_ok=True)
    keys = [identity(folder, f"member-{i}") for i in range(nodes)]
    roster = folder / "roster.yaml"
    roster.write_text(yaml.safe_dump({f"member-{i}": keys[i][1] for i in range(listed)}))
    configs = []
    for i, (key, _) in enumerate(keys):
        config = {"partition-id": i, "num-partitions": nodes, "identity-key": str(key)}
        configs.append({**config, "roster": str(roster), **(policy or {})} if i < listed else config)
    return configs


def grid_of(configs: list[dict], run: dict = RUN) -> InProcessGrid:
    return InProcessGrid(build_client_app(run), CLIENTS, configs, record=True)


class MaskedInputs:
    """What each party put under its masks (``ClusteringClient.masked``'s input, clipped as it is)
    and uploaded, by (party, tag): the ground truth an attack is measured against."""

    def __init__(self, monkeypatch) -> None:
        self.inputs: dict[tuple[int, str], np.ndarray] = {}
        self.uploads: dict[tuple[int, str], np.ndarray] = {}
        self.values: dict[str, dict] = {}
        masked = ClusteringClient.masked

        def recording(client, array, values, participants=None, floor=None):
            out = masked(client, array, values, participants, floor)
            tag, bound = str(values["secagg_tag"]), float(values["secagg_bound"])
            self.inputs[client.shard.client_id, tag] = np.clip(np.asarray(array, dtype=np.float64), -bound, bound)
            self.uploads[client.shard.client_id, tag] = np.array(out, copy=True)
            self.values[tag] = dict(values)
            return out

        monkeypatch.setattr(ClusteringClient, "masked", recording)

    def of(self, party: int) -> list[str]:
        return [tag for p, tag in self.inputs if p == party]


# -- key substitution ----------------------------------------------------------------------------
class KeyRelay:
    """The server's relay of the peers' keys to ``victim`` (partition id; node id
    FIRST_CLIENT_NODE_ID + victim), rewritten by ``rewrite(values, session)``; the session id from
    the hello is kept in :attr:`session`."""

    def __init__(self, monkeypatch, victim: int, rewrite) -> None:
        self.session, self.victim = None, FIRST_CLIENT_NODE_ID + victim
        send = ServerSession._send
        relay = self

        def attacking_send(session, action, category, contents, expect):
            contents = dict(contents)
            for node, content in contents.items():
                arrays, values = unpack(content)
                relay.session = values.get("secagg_session", relay.session)
                if node == relay.victim and any(k.startswith(SECAGG_PEER) for k in values):
                    contents[node] = pack(arrays, rewrite(dict(values), relay.session))
            return send(session, action, category, contents, expect)

        monkeypatch.setattr(ServerSession, "_send", attacking_send)


class ServerKeys:
    """The server's own X25519 keys for parties 1 and 2, put in place of theirs in what party 0 is
    relayed; its endorsements of them by ``endorse`` (the members' own, kept; its own identity's;
    none)."""

    def __init__(self, endorse: str, tmp_path: Path) -> None:
        self.secret = {p: X25519PrivateKey.generate() for p in (1, 2)}
        self.endorse = endorse
        own, _ = identity(tmp_path, "operator")
        self.identity = serialization.load_ssh_private_key(own.read_bytes(), None)

    def __call__(self, values: dict, session: str) -> dict:
        from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

        for p, secret in self.secret.items():
            values[f"{SECAGG_PEER}{p}"] = secret.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
            if self.endorse == "none":
                values.pop(f"{SECAGG_ENDORSED}{p}", None)
            elif self.endorse == "operator":
                raw = self.identity.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
                values[f"{SECAGG_ENDORSED}{p}"] = raw + self.identity.sign(b"any statement")
        return values

    def unmask(self, upload: np.ndarray, victim_key: bytes, session: str, values: dict) -> np.ndarray:
        """Party 0's input from its upload: the server holds the other end of every pair seed."""
        encoder = FixedPointEncoder(values["secagg_scale"], values["secagg_bound"], values["secagg_parties"])
        total = np.array(upload, copy=True)
        for p, secret in self.secret.items():
            impostor = SecAggParty(p, secret, session)
            impostor.agree({0: victim_key, p: impostor.public_key_bytes()})
            np.add(total, impostor.mask(np.zeros(upload.shape), values["secagg_tag"] + "", encoder, [0, p]), out=total)
        return encoder.decode(total)


@pytest.mark.parametrize("endorse", ["members", "operator", "none"])
def test_a_server_substituting_its_own_keys_unmasks_nothing(tmp_path, monkeypatch, endorse):
    """The server relays to member 0 keys of its own for members 1 and 2 (endorsed as the members
    endorsed theirs, by an identity of its own, or not at all). Member 0 refuses the step that
    relays them (rule 'roster') before any masked upload leaves it: the server reads nothing of
    its inputs (without the roster it read member 0's every statistic exactly)."""
    inputs = MaskedInputs(monkeypatch)
    keys = ServerKeys(endorse, tmp_path)
    relay = KeyRelay(monkeypatch, 0, keys)
    grid = grid_of(member_configs(tmp_path))
    try:
        run_server(grid, RUN)
    except (PrivacyRefused, ProtocolError) as err:
        stopped = err
    else:
        stopped = None
    victim_key = next(unpack(m.content)[1]["public_key"] for m in grid.pulled
                      if m.metadata.src_node_id == FIRST_CLIENT_NODE_ID and "public_key" in unpack(m.content)[1])
    read = [keys.unmask(inputs.uploads[0, tag], victim_key, relay.session, inputs.values[tag]) for tag in inputs.of(0)]
    exact = [np.allclose(r, inputs.inputs[0, tag], atol=1e-3) for r, tag in zip(read, inputs.of(0))]
    assert not any(exact), f"the server read {sum(exact)} of member 0's masked inputs"
    assert inputs.of(0) == [], "member 0 masked an upload under keys it had not checked"
    assert isinstance(stopped, PrivacyRefused) and stopped.refusals.get(0, ("",))[0] == "roster", stopped


def test_a_server_swapping_two_members_keys_stops_the_run_before_anything_is_masked(tmp_path, monkeypatch):
    """Member 0 is relayed member 1's key (and endorsement) as member 2's and the other way round:
    each endorsement signs its own party id, so member 0 refuses (rule 'roster') and masks nothing;
    members 1 and 2, relayed the true keys, masked with member 0's true key, which the server
    cannot remove: no sum is unmasked."""
    def swap(values: dict, session: str) -> dict:
        for prefix in (SECAGG_PEER, SECAGG_ENDORSED):
            values[f"{prefix}1"], values[f"{prefix}2"] = values.get(f"{prefix}2"), values.get(f"{prefix}1")
        return {k: v for k, v in values.items() if v is not None}

    inputs = MaskedInputs(monkeypatch)
    KeyRelay(monkeypatch, 0, swap)
    with pytest.raises(PrivacyRefused) as refused:
        run_server(grid_of(member_configs(tmp_path)), RUN)
    assert refused.value.refusals[0][0] == "roster"
    assert inputs.of(0) == []


# -- sybils ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("sybil_key", [True, False])
def test_a_sybil_does_not_count_towards_min_group(tmp_path, monkeypatch, sybil_key):
    """Two members, each with min-group 3, and a third node the operator registered (with an identity
    key of its own, or none): the members refuse to mask with it (rule 'roster'); without the roster
    the run went ahead, the sybil counted as the third of the group."""
    configs = member_configs(tmp_path, listed=2, policy={"privacy.all.min-group": 3})
    if not sybil_key:
        configs[2].pop("identity-key")
    inputs = MaskedInputs(monkeypatch)
    with pytest.raises(PrivacyRefused) as refused:
        run_server(grid_of(configs), RUN)
    assert {p: rule for p, (rule, _) in refused.value.refusals.items()} == {0: "roster", 1: "roster"}
    assert inputs.of(0) == inputs.of(1) == []


def test_members_on_the_roster_run_as_without_it(tmp_path):
    """Three members on the roster, min-group 3: the run completes with the labels of the same run
    without identities or rosters."""
    with_roster = run_server(grid_of(member_configs(tmp_path, policy={"privacy.all.min-group": 3})), RUN, write=False)
    plain = run_server(InProcessGrid(build_client_app(RUN), CLIENTS), RUN, write=False)
    assert np.array_equal(with_roster["labels"], plain["labels"])


# -- split survivor sets ---------------------------------------------------------------------------
class Stop(Exception):
    """The attacker ends the run once it has what it came for."""


def split_requests(session, replies, values, told: dict[int, tuple[list, list]]) -> dict[int, dict]:
    """The unmask request values the attacker sends each node (by node id): the split ``told[party]``."""
    arrays = {session.partition_of(n): unpack(c)[0] for n, c in replies.items()}
    size = next(iter(arrays.values()))["stats"].size
    base = {k: values[k] for k in ("secagg_tag", "secagg_scale", "secagg_bound", "secagg_parties")}
    return {n: {**base, "secagg_survivors": told[session.partition_of(n)][0],
                "secagg_dropped": told[session.partition_of(n)][1], "secagg_size": size}
            for n in replies if session.partition_of(n) in told}


def ask_to_unmask(session, replies, requests: dict[int, dict]) -> dict[int, dict]:
    """The attacker's unmask round with ``requests`` (after the consistency round, where the protocol
    has one: each node signs its own split, every signature relayed to every node): the answers."""
    told = {n: {k: r[k] for k in ("secagg_tag", "secagg_survivors", "secagg_dropped")} for n, r in requests.items()}
    signed = session.exchange(SECAGG_CONSISTENCY, {n: pack(values=v) for n, v in told.items()}, require_all=False)
    signatures = {f"{SECAGG_SIGNED}{session.partition_of(n)}": unpack(c)[1][SURVIVOR_SIGNATURE]
                  for n, c in signed.items()}
    requests = {n: {**r, **signatures} for n, r in requests.items()}
    rows = {session.partition_of(n): unpack(c)[0]["secagg_shares"] for n, c in replies.items()}
    contents = {}
    for node, request in requests.items():
        mine = np.zeros_like(next(iter(rows.values())))
        for u in request["secagg_survivors"]:
            mine[u] = rows[u][session.partition_of(node)]
        contents[node] = pack({SECAGG_INBOX: mine}, request)
    answered = session.exchange(SECAGG_UNMASK, contents, require_all=False)
    return {session.partition_of(n): unpack(c)[0] for n, c in answered.items()}


def test_a_split_survivor_set_unmasks_no_member(tmp_path, monkeypatch):
    """Three members, a sum that survives dropouts (threshold 2), nobody dropped. The server tells
    member 0 that member 1 dropped, member 2 that member 0 dropped, member 1 that all survived:
    member 0 gives its own share of its self mask and its pair masks with 1, member 1 its share of
    0's self mask, member 2 its pair masks with 0, each within its one-split rule, and together
    they give member 0's input (without the consistency round the server read it exactly). Every
    survivor signed the set it was told, so each member finds a survivor's signature over another
    set and refuses (rule 'secagg-consistency'): no share of a mask leaves any member."""
    inputs = MaskedInputs(monkeypatch)
    answered, read = [], []

    def split(session, replies, name, values, encoder):
        tag = str(values["secagg_tag"])
        told = {0: ([0, 2], [1]), 1: ([0, 1, 2], []), 2: ([1, 2], [0])}
        answers = ask_to_unmask(session, replies, split_requests(session, replies, values, told))
        answered.extend(answers)
        shares = {share_x(0): answers[0]["self_shares"][0].tobytes(), share_x(1): answers[1]["self_shares"][0].tobytes()}
        upload = inputs.uploads[0, tag].reshape(-1).copy()
        seed = shamir_reconstruct({x: int.from_bytes(share, "little") for x, share in shares.items()})
        np.subtract(upload, self_mask(seed, tag, upload.size, upload.dtype), out=upload)
        np.subtract(upload, answers[0]["correction"], out=upload)  # member 0's side of its pair with 1
        np.add(upload, answers[2]["correction"], out=upload)  # member 2's side of its pair with 0
        read.append((tag, encoder.decode(upload)))
        raise Stop

    monkeypatch.setattr(SecureAggregation, "_recovered_sum", split)
    with pytest.raises((PrivacyRefused, Stop)) as stopped:
        run_server(grid_of(member_configs(tmp_path), RECOVERING), RECOVERING)
    exact = [tag for tag, x in read if np.allclose(x, inputs.inputs[0, tag].reshape(-1), atol=1e-3)]
    assert exact == [], "the server read member 0's input"
    assert answered == [], f"members {answered} answered the unmask round"
    assert isinstance(stopped.value, PrivacyRefused)
    assert {rule for rule, _ in stopped.value.refusals.values()} == {"secagg-consistency"}


def test_members_sign_the_survivor_set_and_the_sum_goes_on_without_a_member_that_left(tmp_path):
    """Four members on the roster, fedkmeans with dropout recovery; member 3 leaves after masking
    round 2. The survivors sign the set they are told (one consistency round per sum) and the run
    ends with the labels of the same run without identity keys."""
    from test_secagg_recovery import MaskThenLeaveGrid

    raw = {"strategy": "fedkmeans", "dataset": "iris", "num-clients": 4, "num-rounds": 4, "min-clients": 2,
           "fedkmeans.secure": True, "fedkmeans.tol": 0.0, "timeout": 30.0, "reference": False}
    results = []
    for configs in (member_configs(tmp_path, listed=4, nodes=4), None):
        grid = MaskThenLeaveGrid(build_client_app(raw), 4, configs, leave_at=2, action="kmeans_step")
        results.append(run_server(grid, raw, write=False))
    signed, plain = results
    assert [d["client"] for d in signed["communication"]["dropped"]] == [3]
    assert np.array_equal(signed["labels"], plain["labels"])
    rounds = [r["action"] for r in signed["timing"]["per_round"]]
    assert rounds.count("secagg_consistency") == rounds.count("secagg_unmask") == len(signed["history"])
    assert "secagg_consistency" not in [r["action"] for r in plain["timing"]["per_round"]]


# -- the roster and identity files -------------------------------------------------------------------
def test_an_endorsement_holds_for_its_run_session_step_party_and_parties_only(tmp_path):
    """An endorsement replayed in another run, session, step, for another party or another set of
    parties, or over another key, is refused naming the party; so is one by an identity not on the
    roster, a missing one, and one member endorsing two parties."""
    from fedgraphcore.config import ConfigError
    from fedgraphcore.privacy.roster import check_endorsed, endorse, key_statement, load_identity, load_roster, public_bytes

    configs = member_configs(tmp_path)
    ids = [load_identity(c["identity-key"]) for c in configs]
    roster = load_roster(configs[0]["roster"])
    key = bytes(32 * [7])
    honest = key_statement(5, "s", "hello", 1, 3, key)
    endorsement = endorse(ids[1], honest)
    own = public_bytes(ids[0])
    assert check_endorsed(roster, 0, own, {1: endorsement}, {1: honest}) == {0: own, 1: public_bytes(ids[1])}
    for other in (key_statement(6, "s", "hello", 1, 3, key), key_statement(5, "t", "hello", 1, 3, key),
                  key_statement(5, "s", "secagg_setup", 1, 3, key), key_statement(5, "s", "hello", 2, 3, key),
                  key_statement(5, "s", "hello", 1, 4, key), key_statement(5, "s", "hello", 1, 3, bytes(32))):
        with pytest.raises(Exception, match="party 1's endorsement .* does not sign"):
            check_endorsed(roster, 0, own, {1: endorsement}, {1: other})
    stranger = Ed25519PrivateKey.generate()
    with pytest.raises(Exception, match="not in this node's roster"):
        check_endorsed(roster, 0, own, {1: endorse(stranger, honest)}, {1: honest})
    with pytest.raises(Exception, match="without an endorsement"):
        check_endorsed(roster, 0, own, {}, {1: honest})
    twice = key_statement(5, "s", "hello", 2, 3, key)
    with pytest.raises(Exception, match="endorses the keys of parties 1 and 2"):
        check_endorsed(roster, 0, own, {1: endorsement, 2: endorse(ids[1], twice)}, {1: honest, 2: twice})
    bad = tmp_path / "bad.yaml"
    for text, message in (("[1, 2]", "not a YAML map"), ("a: ssh-rsa AAAA", "not an Ed25519 public key"),
                          (f"a: {yaml.safe_load(Path(configs[0]['roster']).read_text())['member-0']}\n"
                           f"b: {yaml.safe_load(Path(configs[0]['roster']).read_text())['member-0']}", "two names")):
        bad.write_text(text)
        with pytest.raises(ConfigError, match=message):
            load_roster(bad)
    with pytest.raises(ConfigError, match="not an unencrypted Ed25519 private key"):
        load_identity(configs[0]["roster"])


def test_a_roster_without_the_nodes_own_identity_refuses_every_secure_step(tmp_path):
    """A node whose roster does not list its own identity key (or that has no identity key) is
    misconfigured: its first secure step fails with the rule named, nothing masked."""
    configs = member_configs(tmp_path)
    configs[1]["identity-key"] = configs[2]["identity-key"].replace("member-2", "member-x")
    identity(Path(configs[1]["identity-key"]).parent, "member-x")
    with pytest.raises(ProtocolError, match="node config 'roster', rule 'lists this node's identity key'"):
        run_server(grid_of(configs), RUN)


def test_the_roster_command_writes_each_members_key_under_its_name(tmp_path, capsys):
    from deploy.__main__ import main
    from deploy.signing import make_signing_key

    publics = [make_signing_key(tmp_path / "keys", f"hospital-{c}")[1] for c in "ab"]
    main(["roster", "--out", str(tmp_path / "roster.yaml"), *map(str, publics)])
    written = yaml.safe_load((tmp_path / "roster.yaml").read_text())
    assert written == {f"hospital-{c}": p.read_text().strip() for c, p in zip("ab", publics)}
    assert main(["roster", "--out", str(tmp_path / "again.yaml"), str(publics[0]), str(publics[0])]) == 2
    assert "each member once" in capsys.readouterr().err
    assert not (tmp_path / "again.yaml").exists()
