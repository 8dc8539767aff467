"""Real deployment: SuperLink and SuperNodes as separate processes on loopback.

TLS with a private CA, SuperNode authentication with registered keys, one
shard file per SuperNode, ``flwr run`` against the SuperLink. Slow (every
message starts a ClientApp process), so kept to small runs.
"""

from __future__ import annotations

import contextlib
import json
import re
import subprocess
import threading

import numpy as np
import pytest

from app.run import run_experiment
from conftest import check_page, HANG_GUARD_S, REPO, RUN_GUARD_S, wait_until
from deploy.__main__ import run_local
from deploy.federation import BIN, CONNECTION, LocalFederation
from deploy.pki import make_all, make_node_keys

pytestmark = pytest.mark.deployment



SMALL_SBM = ["sbm.nodes=300", "sbm.features=8"]
DEPLOYED = {
    "fedkmeans": ("node-random", ["fedkmeans.secure=true", "num-rounds=3"]),  # secure aggregation's keys with hello
    "fedspectral-plus": ("edge", ["fedspectral-plus.mode=paper", "fedspectral-plus.rounds=3",
                                  "fedspectral-plus.iters=2"]),
    "kcagc": ("vertical", ["kcagc.iterations=2", "kcagc.restarts=1", "kcagc.local-restarts=1",
                           "kcagc.filter-order=2"]),
}


def test_a_bad_run_config_stops_before_any_certificate_shard_or_process(tmp_path):
    """Nothing starts: a bad key stops the federation before its first certificate, shard or process."""
    from fedgraphcore.config import ConfigError

    with pytest.raises(ConfigError, match="^dataset 'mutag' is a graph collection; strategy 'kcagc'"):
        run_local(2, "kcagc", "mutag", "auto", [], tmp_path / "deployed")
    assert not (tmp_path / "deployed").exists()


@pytest.mark.shipped_defaults
@pytest.mark.parametrize("strategy, attacked", [pytest.param("kcagc", False, marks=pytest.mark.slow),
                                                pytest.param("fedspectral-plus", False, marks=pytest.mark.slow),
                                                ("fedkmeans", False),
                                                pytest.param("fedkmeans", True, marks=pytest.mark.slow)])
def test_deployed_run_equals_the_in_process_run(strategy, attacked, tmp_path):
    """The deployed run (its SuperNodes members with identity keys and the roster: each secure sum
    that survives dropouts takes one more round, the survivors' signatures) gives the in-process
    labels. Attacked, it runs while strangers at eight addresses hold bodies at the gateway
    (``benchmarks/gateway_attack.py``'s attack): their every connection is refused or answered 503
    (``tests/test_gateway.py`` holds bodies from two addresses at ``deploy local``'s gateway and
    every slot from eight, in the integration tests)."""
    from gateway_attack import Attack

    partitioner, sets = DEPLOYED[strategy]
    with Attack(tmp_path / "deployed", pause_s=1.0) if attacked else contextlib.nullcontext() as attack:
        path = run_local(3, strategy, "sbm", partitioner, SMALL_SBM + sets, tmp_path / "deployed", timeout=RUN_GUARD_S)
    deployed = json.loads(path.read_text())
    overrides = {"partitioner": partitioner, **dict(s.split("=", 1) for s in SMALL_SBM + sets)}
    local = run_experiment(strategy, "sbm", 3, overrides, tmp_path / "inprocess")
    assert np.array_equal(np.load(path.parent / "labels.npy"), np.load(tmp_path / "inprocess" / "labels.npy"))
    for name in ("acc", "nmi", "ari", "modularity"):
        assert deployed["metrics"][name] == pytest.approx(local["metrics"][name])
    signed = [r["action"] for r in deployed["timing"]["per_round"]].count("secagg_consistency")
    assert deployed["num_clients"] == 3 and deployed["timing"]["rounds"] - signed == local["timing"]["rounds"]
    if strategy == "fedkmeans":  # fedkmeans.secure: members' signatures on every recoverable sum
        assert signed == [r["action"] for r in deployed["timing"]["per_round"]].count("secagg_unmask") > 0
    if attacked:  # what the attack got
        ended = attack.counts["ended"]
        assert sum(ended.values()) > 0 and set(ended) <= {"503", "refused", "closed"}, ended
    drawn = (tmp_path / "inprocess" / "report.html").read_text().count("<img ")
    check_page(path.parent, figures=drawn)  # the deployed server's page draws what the in-process one does


def connected(federation: LocalFederation, name: str) -> bool:
    return "SuperNode ID:" in federation.log(name)


def test_only_registered_nodes_with_the_ca_certificate_can_join(tmp_path):
    pki = tmp_path / "pki"
    make_all(pki, 1)
    stranger_key, _ = make_node_keys(tmp_path, 99)  # never registered
    other_ca = tmp_path / "other"
    make_all(other_ca, 0)
    shard = tmp_path / "unused.npz"
    with LocalFederation(tmp_path / "fed", pki) as federation:
        federation.start_superlink()
        federation.register(pki / "supernode-0.pub")
        federation.start_supernode("registered", shard, private_key=pki / "supernode-0",
                                   root_certificates=pki / "ca.crt")
        federation.start_supernode("unregistered", shard, private_key=stranger_key,
                                   root_certificates=pki / "ca.crt")
        federation.start_supernode("wrong-ca", shard, private_key=pki / "supernode-0",
                                   root_certificates=other_ca / "ca.crt")
        federation.start_supernode("no-tls", shard, private_key=pki / "supernode-0")
        wait_until(lambda: connected(federation, "registered"), "the registered SuperNode to connect")
        refused = ("unregistered", "wrong-ca", "no-tls")
        # each of them gives up with an error exit once the SuperLink or TLS refuses it
        wait_until(lambda: all(federation.processes[name].poll() is not None for name in refused),
                   "the refused SuperNodes to exit")
        for name in refused:
            assert federation.processes[name].returncode != 0, federation.log(name)[-2000:]
            assert not connected(federation, name), federation.log(name)[-2000:]


KILLED = {
    # needs every party: must stop with a clear error and write no result
    "kcagc": ("vertical", {"kcagc.mode": "paper", "kcagc.iterations": 100, "kcagc.restarts": 1,
                           "kcagc.local-restarts": 1, "kcagc.filter-order": 2}),
    # tolerates dropouts on the paper's split (its whole-graph training needs every party): finishes with the
    # others and records who dropped
    "fedavg-dmon": ("node-random", {"num-rounds": 7, "fedavg-dmon.local-epochs": 1, "min-clients": 2,
                                    "partition.boundary": False}),
}


def _small_federation_files(out, nodes: int, partitioner: str = "node-random", strategy: str = "fedkmeans",
                            overrides=None):
    """PKI, shards and eval file of the small SBM for ``nodes`` SuperNodes under ``out``; the run config
    (``overrides``: the strategy's settings, default 3 rounds)."""
    from fedgraphcore.data import prepare

    make_all(out / "pki", nodes)
    prepare.run(["--dataset", "sbm", "--partitioner", partitioner, "--num-clients", str(nodes), "--out",
                 str(out / "shards"), "--eval-file", str(out / "eval.npz"), *sum((["--set", s] for s in SMALL_SBM), []),
                 *sum((["--set", f"{k}={v}"] for k, v in (overrides or {}).items() if k.startswith("partition.")), [])])
    return {"strategy": strategy, "dataset": "sbm", "partitioner": partitioner, "num-clients": nodes,
            **dict(s.split("=", 1) for s in SMALL_SBM), **(overrides or {"num-rounds": 3}),
            "eval-file": str(out / "eval.npz"), "reference": False, "out-dir": str(out / "result")}


def _run_with_fault(out, config, fault, **options):
    """Start the SuperLink and one SuperNode per shard under ``out``, run ``fault(federation)`` in a thread
    while ``flwr run`` runs ``config``; return the finished ``flwr run`` and the (closed) federation,
    whose logs stay readable. The federation closes once both ``flwr run`` and the fault are over (the
    fault may wait for what the processes do after the run, e.g. SuperNodes giving up)."""
    with LocalFederation(out, out / "pki", **options) as federation:
        federation.start_superlink()
        federation.start_nodes([out / "shards" / f"client-{i}.npz" for i in range(int(config["num-clients"]))])
        faulting = threading.Thread(target=fault, args=(federation,), daemon=True)
        faulting.start()
        proc = federation.run_app(REPO, config, timeout=RUN_GUARD_S)
        faulting.join()  # its own waits are bounded by their hang guards
    return proc, federation


@pytest.mark.slow
@pytest.mark.parametrize("strategy", sorted(KILLED))
def test_killing_a_supernode_mid_run(strategy, tmp_path):
    partitioner, overrides = KILLED[strategy]
    out = tmp_path / "run"
    # The run's default timeout (600 s per step) applies: the killed node is noticed by the SuperLink's
    # heartbeat, and a live node that is merely slow (a busy machine) must not count as gone.
    config = _small_federation_files(out, 3, partitioner, strategy, overrides)
    killed = threading.Event()

    def kill_mid_run(federation):
        wait_until(lambda: "ROUND 6]" in federation.log("supernode-1"), "supernode-1 to receive round 6", RUN_GUARD_S)
        federation.kill("supernode-1")
        killed.set()

    proc, federation = _run_with_fault(out, config, kill_mid_run)
    logs = "\n".join(f"--- {name}:\n{federation.log(name)[-1500:]}" for name in ("supernode-0", "supernode-2"))
    log = proc.stdout + proc.stderr
    report = f"{log[-3000:]}\n{logs}"  # the run's log and the survivors', e.g. Flower's task-token errors
    assert killed.is_set(), report  # the run reached round 6 with every node
    result = out / "result" / "result.json"
    if strategy == "kcagc":
        assert re.search(r"step '\w+' rejected 1 client\(s\): client 1 ", log), report
        assert not result.exists()
    else:
        assert result.exists(), report
        dropped = json.loads(result.read_text())["communication"]["dropped"]
        assert [d["client"] for d in dropped] == [1], report


def test_a_config_error_under_flwr_run_is_the_one_line_app_run_prints(tmp_path):
    """The ServerApp logs `error: ...` and Flower neither its traceback nor its exit-code notice;
    the run is marked failed with the message as its reason."""
    with LocalFederation(tmp_path / "fed", None) as federation:  # the error comes before any SuperNode is needed
        federation.start_superlink()
        proc = federation.run_app(REPO, {"seed": -1}, timeout=RUN_GUARD_S)
        runs = subprocess.run([str(BIN / "flwr"), "ls", CONNECTION, "--format", "json"], env=federation.env,
                              capture_output=True, text=True, timeout=HANG_GUARD_S)
    log = proc.stdout + proc.stderr
    message = "value -1 for 'seed' is out of range; valid range: [0, 4294967295]"
    errors = [line for line in log.splitlines() if "ERROR" in line or "Traceback" in line or "Exit Code" in line]
    assert len(errors) == 1 and errors[0].endswith(f"error: {message}"), log
    [run] = json.loads(runs.stdout)["runs"]
    assert "failed" in run["status"] and message in run["status-details"], runs.stdout



STRANGER_PYPROJECT = """\
[build-system]
requires = ["setuptools>=68"]
build-backend = "setuptools.build_meta"

[project]
name = "stranger"
version = "1.0.0"
dependencies = []

[tool.flwr.app]
publisher = "stranger"

[tool.flwr.app.components]
serverapp = "stranger_app:server"
clientapp = "stranger_app:client"

[tool.flwr.app.config]
marker-dir = ""
"""

STRANGER_APP = '''\
"""Reads every member's shard file and sends its sha256 home (the attack on an open federation)."""
import hashlib
import pathlib
import time

from flwr.app import ConfigRecord, Context, Message, RecordDict
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid, ServerApp

client = ClientApp()
server = ServerApp()


@client.query()
def steal(message: Message, context: Context) -> Message:
    data = pathlib.Path(str(context.node_config["shard"])).read_bytes()
    digest = hashlib.sha256(data).hexdigest()
    marker = pathlib.Path(str(context.run_config["marker-dir"])) / f"stolen-{context.node_id}"
    marker.write_text(digest)
    return Message(RecordDict({"loot": ConfigRecord({"sha256": digest})}), reply_to=message)


@server.main()
def main(grid: Grid, context: Context) -> None:
    while not list(grid.get_node_ids()):
        time.sleep(0.5)
    messages = [Message(RecordDict(), dst_node_id=node, message_type="query") for node in grid.get_node_ids()]
    for reply in grid.send_and_receive(messages, timeout=600):
        print("stranger got", reply.has_content() and dict(reply.content["loot"]))
'''


def _stranger_cli(tmp_path, address: str, ca: "Path") -> dict:
    """A FLWR_HOME whose only connection is the address members' SuperNodes use, with ca.crt."""
    import os

    home = tmp_path / "stranger-home"
    home.mkdir()
    (home / "config.toml").write_text(f'[superlink]\ndefault = "public"\n\n[superlink.public]\n'
                                      f'address = "{address}"\nroot-certificates = "{ca}"\n')
    return {**os.environ, "FLWR_HOME": str(home)}


def test_a_stranger_with_the_ca_certificate_can_neither_register_nor_get_an_app_run(tmp_path):
    """The attack on an open federation: with ca.crt alone, register a SuperNode, list runs and
    run an app that reads the members' shard files. Through the gateway (the only address
    other machines reach) the Control API does not answer; an unsigned app that the operator's
    Control API does accept is refused by every SuperNode before any of its code runs."""
    import subprocess

    from deploy.federation import BIN
    from deploy.signing import make_signing_key, sign_app, write_trusted_entities

    pki = tmp_path / "pki"
    make_all(pki, 2)
    signing_key, signing_public = make_signing_key(tmp_path / "signer")
    sign_app(REPO, signing_key, pki / "signatures")
    trusted = write_trusted_entities([signing_public], tmp_path / "trusted-entities.yaml")
    shards = []
    for i in range(2):
        shards.append(tmp_path / f"client-{i}.npz")
        shards[-1].write_bytes(f"private data of member {i}".encode())
    stranger_app = tmp_path / "stranger-app"
    stranger_app.mkdir()
    (stranger_app / "pyproject.toml").write_text(STRANGER_PYPROJECT)
    (stranger_app / "stranger_app.py").write_text(STRANGER_APP)
    stranger_key, stranger_pub = make_node_keys(tmp_path, 99)
    loot = tmp_path / "loot"
    loot.mkdir()
    with LocalFederation(tmp_path / "fed", pki) as federation:
        federation.start_superlink()
        federation.start_gateway(pki / "signatures")
        federation.start_nodes(shards, trusted_entities=trusted)
        env = _stranger_cli(tmp_path, federation.fleet_address, (pki / "ca.crt").resolve())

        def stranger(*args):
            return subprocess.run([str(BIN / "flwr"), *args], env=env, capture_output=True, text=True,
                                  timeout=300, cwd=tmp_path)

        register = stranger("supernode", "register", str(stranger_pub), "public")
        assert register.returncode != 0 and "registered successfully" not in register.stdout, register.stdout
        listed = stranger("ls", "public")
        assert listed.returncode != 0, listed.stdout
        submitted = stranger("run", str(stranger_app), "public", "--run-config", f"marker-dir='{loot}'")
        assert submitted.returncode != 0 and "Successfully started run" not in submitted.stdout, submitted.stdout
        federation.start_supernode("stranger-node", shards[0], private_key=stranger_key,
                                   root_certificates=pki / "ca.crt")
        # the operator's own Control API (loopback) accepts the unsigned app; the members refuse it
        accepted = federation.run_app(stranger_app, {"marker-dir": str(loot)}, timeout=600)
        assert "Successfully started run" in accepted.stdout, accepted.stdout + accepted.stderr
        refused, gave_up = "The FAB could not be verified", "Exit Code: 305"  # 305: no connection to the SuperLink
        wait_until(lambda: gave_up in federation.log("stranger-node") and all(
            refused in federation.log(f"supernode-{i}") for i in range(2)),
            "every member to refuse the unsigned app and the stranger's node to give up")
        for i in range(2):
            assert refused in federation.log(f"supernode-{i}"), federation.log(f"supernode-{i}")[-3000:]
        assert gave_up in federation.log("stranger-node"), federation.log("stranger-node")[-2000:]
        assert not connected(federation, "stranger-node")
    assert list(loot.iterdir()) == []  # no ClientApp of the stranger's ever ran


@pytest.mark.slow
def test_a_killed_supernode_restarted_with_its_key_rejoins_as_the_same_node(tmp_path):
    """Flower refuses to activate a key whose previous instance is still online (until its heartbeat
    expires, 60 s); restart_supernode retries with a bounded back-off, logging each refusal."""
    _small_federation_files(tmp_path, 1)
    with LocalFederation(tmp_path, tmp_path / "pki") as federation:
        federation.start_superlink()
        federation.start_nodes([tmp_path / "shards" / "client-0.npz"])
        wait_until(lambda: "SuperNode ID: " in federation.log("supernode-0"), "supernode-0 to join")
        federation.kill("supernode-0")
        attempts = federation.restart_supernode("supernode-0", timeout=HANG_GUARD_S)
        log = federation.log("supernode-0")
    ids = re.findall(r"SuperNode ID: (\d+)", log)
    assert len(ids) == 2 and ids[0] == ids[1], log  # the same node, by its registered key
    assert log.count("restart: the SuperLink still counts supernode-0's previous instance online") == attempts - 1
    assert log.count("Failed to activate SuperNode") == attempts - 1, log


@pytest.mark.slow
def test_a_superlink_killed_mid_run_fails_the_run_and_the_supernodes_give_up(tmp_path):
    config = _small_federation_files(tmp_path, 2)

    def kill_mid_run(federation):
        wait_until(lambda: "[RUN " in federation.log("supernode-0"), "supernode-0 to receive a message", RUN_GUARD_S)
        federation.kill("superlink")
        for name in ("supernode-0", "supernode-1"):
            wait_until(lambda: "Giving up reconnection after" in federation.log(name),
                       f"{name} to give up on the SuperLink")
        gave_up.set()

    gave_up = threading.Event()
    proc, federation = _run_with_fault(tmp_path, config, kill_mid_run, superlink_wait_s=5.0)
    wait_until(gave_up.is_set, "the SuperNodes to give up on the SuperLink")
    assert proc.returncode != 0
    assert not (tmp_path / "result" / "result.json").exists()


@pytest.mark.slow
def test_a_supernode_stopped_within_the_heartbeat_is_slow_not_dropped(tmp_path):
    """SIGSTOP freezes a SuperNode (and its ClientApp) for a third of the heartbeat expiry, longer than
    its steps take: the run waits for it (the step timeout is 600 s) and finishes with every client."""
    import os
    import signal
    import time

    from deploy.federation import REJOIN_S

    config = _small_federation_files(tmp_path, 2)
    stopped = threading.Event()

    def stop_mid_run(federation):
        wait_until(lambda: federation.log("supernode-1").count("[RUN ") >= 2, "supernode-1 to get its 2nd message",
                   RUN_GUARD_S)
        group = federation.processes["supernode-1"].pid
        os.killpg(group, signal.SIGSTOP)
        stopped.set()
        time.sleep(REJOIN_S / 3)  # the fault's length, not a wait for an event
        os.killpg(group, signal.SIGCONT)

    proc, _ = _run_with_fault(tmp_path, config, stop_mid_run)
    report = (proc.stdout + proc.stderr)[-3000:]
    assert stopped.is_set(), report
    result = json.loads((tmp_path / "result" / "result.json").read_text())
    assert result["communication"]["dropped"] == [] and result["communication"]["rejected"] == [], report


def test_a_deployed_run_over_its_limit_is_stopped_in_one_line_with_its_log_kept(tmp_path, monkeypatch):
    """``run_local`` has no limit unless given one; past it, ``flwr run`` is stopped, what it wrote
    kept in ``flwr-run.log``, and the error names the limit and the log."""
    import inspect

    from deploy import __main__ as deploy_main
    from deploy.federation import LocalFederation

    assert inspect.signature(run_local).parameters["timeout"].default is None
    assert inspect.signature(LocalFederation.run_app).parameters["timeout"].default is None

    def over_the_limit(self, app_dir, run_config, timeout=None):
        raise subprocess.TimeoutExpired(["flwr", "run"], timeout, output=b"round 1 (at most 20)\n", stderr=None)

    monkeypatch.setattr(LocalFederation, "run_app", over_the_limit)
    with pytest.raises(RuntimeError, match=rf"^the deployed run was stopped after its limit of {RUN_GUARD_S:g} s; "
                                           r"see .*flwr-run.log$"):
        run_local(2, "fedkmeans", "sbm", "auto", SMALL_SBM, tmp_path / "deployed", timeout=RUN_GUARD_S)
    assert (tmp_path / "deployed" / "flwr-run.log").read_text() == "round 1 (at most 20)\n"
    assert deploy_main._text(None) == "" and deploy_main._text("x") == "x"
