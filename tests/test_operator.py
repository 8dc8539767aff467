"""``python -m deploy run``: exit 0 only for a run that finished completed with a result; otherwise
one line naming why, and the cause's exit code (:mod:`deploy.submit`).

``flwr run`` exits 0 for a run whose app every SuperNode refused: the deployment tests show that
first, then the same run through ``deploy run``. The verdict logic is checked on the JSON that
Flower's own ``flwr ls --format json`` code makes of its own run records, with the failure texts
the app's own exceptions produce.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from flwr.cli.ls import _to_json
from flwr.cli.run_utils import format_runs
from flwr.supercore.run import Run, RunStatus

from fedgraphcore.session import PrivacyRefused
from fedgraphcore.transport import LEFT, NO_REPLY
from fedgraphcore.wire import ProtocolError
from conftest import HANG_GUARD_S, wait_until
from deploy import submit
from deploy.submit import (APP_REFUSED, BAD_INPUT, COMPLETED, FAILED, NO_RESULT, NODE_LOST, NOT_SUBMITTED,
                           POLICY_REFUSED, STILL_RUNNING, STOPPED, SUPERLINK_LOST, RunState, parse_ls, verdict)

NOW = "2025-01-01T00:10:00+00:00"


def flwr_ls_json(run_id: int, status: str, sub_status: str, details: str) -> str:
    """What ``flwr ls --run-id RUN_ID --format json`` prints for such a run (Flower's own code)."""
    run = Run.create_empty(run_id)
    run.fab_id, run.fab_version, run.fab_hash = "fedgraph/fedgraph-clustering", "0.1.0", "ab" * 32
    run.pending_at = run.starting_at = run.running_at = "2025-01-01T00:00:00+00:00"
    run.finished_at = "2025-01-01T00:05:00+00:00" if status == "finished" else ""
    run.status = RunStatus(status, sub_status, details)
    return _to_json(format_runs([run], NOW))


def judged(status: str, sub_status: str, details: str, result: Path) -> tuple[int, str]:
    return verdict(parse_ls(flwr_ls_json(7, status, sub_status, details), 7), result)


def failed(message: str) -> str:
    """Flower's status details of a ServerApp that raised ``message``."""
    return f"ServerApp failed with exception: {message}"


def test_the_refusal_text_is_flowers():
    from flwr.supernode.start_client_internal import FAB_VERIFICATION_ERROR

    assert submit.FAB_REFUSED == FAB_VERIFICATION_ERROR.reason


def test_completed_with_a_result_is_the_only_success(tmp_path):
    result = tmp_path / "result.json"
    assert judged("finished", "completed", "", result) == (NO_RESULT, f"run 7 completed but wrote no result: "
                                                                      f"{result} does not exist")
    result.write_text("{}")
    assert judged("finished", "completed", "", result) == (COMPLETED, f"run 7 completed: result {result}")
    assert judged("finished", "stopped", "", result)[0] == STOPPED
    assert judged("running", "", "", result)[0] == SUPERLINK_LOST  # the stream ended, the run did not


def test_each_failure_is_named_with_its_own_code(tmp_path):
    result = tmp_path / "result.json"
    result.write_text("{}")  # a stale file never turns a failed run into a success
    refused_app = ProtocolError("step 'hello' rejected 2 client(s): nodes 11, 12 all: client error: "
                                "The FAB could not be verified.")
    code, line = judged("finished", "failed", failed(refused_app), result)
    assert code == APP_REFUSED and "refused the app: no key they trust signed this bundle" in line
    refusal = PrivacyRefused("kmeans_stats", {0: ("secure-aggregation", "asked in clear")},
                             "client 0 (node 11), rule 'secure-aggregation': asked in clear; client 1 (node 12), "
                             "rule 'secure-aggregation': asked in clear")
    code, line = judged("finished", "failed", failed(refusal), result)
    assert code == POLICY_REFUSED and "(rule secure-aggregation)" in line and "client 1 (node 12)" in line
    for lost in (f"step 'kmeans_stats' rejected 1 client(s): client 1 (node 12): {LEFT} (node gone)",
                 f"step 'kmeans_stats' rejected 1 client(s): client 1 (node 12): {NO_REPLY} 600 s",
                 "only 1 SuperNodes connected within timeout=600 s (num-clients=2)"):
        code, line = judged("finished", "failed", failed(ProtocolError(lost)), result)
        assert code == NODE_LOST and line.endswith(lost), line
    code, line = judged("finished", "failed", failed("value -1 for 'seed' is out of range"), result)
    assert (code, line) == (FAILED, "run 7 failed: value -1 for 'seed' is out of range")
    assert judged("finished", "failed", "Task failed because the run expired", result)[0] == FAILED


def test_the_verdict_is_one_line(tmp_path):
    code, line = judged("finished", "failed", failed("first line\n  second line"), tmp_path / "r.json")
    assert line == "run 7 failed: first line second line"


def test_flwr_ls_output_names_the_run():
    assert parse_ls("📄 Listing...\n" + flwr_ls_json(3, "running", "", ""), 3) == RunState(3, "running", "")
    with pytest.raises(ValueError, match="does not list run 4"):
        parse_ls(flwr_ls_json(3, "running", "", ""), 4)


@pytest.mark.parametrize("run_config, problem", [
    (["strategy='fedkmeans'"], "out-dir ''; valid: an absolute path"),
    (["out-dir='results/x'"], "out-dir 'results/x'; valid: an absolute path"),
    (["seed=-1 out-dir='/tmp/x'"], "value -1 for 'seed' is out of range"),
    (["strategy='nope' out-dir='/tmp/x'"], "'nope'"),
])
def test_a_bad_run_config_is_refused_before_anything_is_submitted(run_config, problem, tmp_path, capsys,
                                                                 monkeypatch):
    monkeypatch.setenv("FLWR_HOME", str(tmp_path / "no-flower-home"))
    assert submit.run(None, None, run_config) == BAD_INPUT
    err = capsys.readouterr().err
    assert err.startswith("error: run-config: ") and problem in err and len(err.splitlines()) == 1, err
    assert not (tmp_path / "no-flower-home").exists()  # flwr never ran


def test_an_out_dir_holding_a_result_is_refused(tmp_path, capsys):
    (tmp_path / "result.json").write_text("{}")
    assert submit.run(None, None, [f"out-dir='{tmp_path}'"]) == BAD_INPUT
    assert "already holds a result.json" in capsys.readouterr().err


def test_no_superlink_is_not_submitted(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    (home / "config.toml").write_text('[superlink]\ndefault = "x"\n\n[superlink.x]\naddress = "127.0.0.1:9"\n'
                                      "insecure = true\n")
    done = subprocess.run([sys.executable, "-m", "deploy", "run", "--run-config", f"out-dir='{tmp_path / 'out'}'"],
                          capture_output=True, text=True, env={**os.environ, "FLWR_HOME": str(home)},
                          timeout=HANG_GUARD_S, cwd=Path(__file__).resolve().parents[1])
    assert done.returncode == NOT_SUBMITTED, done.stderr
    assert done.stderr.startswith("error: flwr run did not submit the run: ") and len(done.stderr.splitlines()) == 1
    assert "unavailable" in done.stderr


# -- a real deployment ------------------------------------------------------------------------------

SMALL = {"strategy": "fedkmeans", "dataset": "sbm", "partitioner": "node-random", "num-clients": 2,
         "sbm.nodes": 300, "sbm.features": 8, "num-rounds": 3, "reference": False}


def _shards(out: Path, nodes: int) -> list[Path]:
    from fedgraphcore.data import prepare

    prepare.run(["--dataset", "sbm", "--partitioner", "node-random", "--num-clients", str(nodes), "--out",
                 str(out / "shards"), "--eval-file", str(out / "eval.npz"), "--set", "sbm.nodes=300",
                 "--set", "sbm.features=8"])
    return [out / "shards" / f"client-{i}.npz" for i in range(nodes)]


def deploy_run(federation, app: Path | None, config: dict, *options: str) -> subprocess.Popen:
    """``python -m deploy run`` against the federation's SuperLink, as a process."""
    from deploy.federation import CONNECTION, run_config_arg

    args = [sys.executable, "-m", "deploy", "run", *([str(app)] if app else []), "--connection", CONNECTION,
            "--run-config", run_config_arg(config), *options]
    return subprocess.Popen(args, env=federation.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def submitted_run(proc: subprocess.Popen) -> int:
    """The run id ``deploy run`` prints first."""
    first = proc.stdout.readline()
    assert first.startswith("run ") and "submitted" in first, first + proc.stderr.read()
    return int(first.split()[1])


def run_status(federation, run_id: int) -> str:
    from deploy.federation import BIN, CONNECTION

    listed = subprocess.run([str(BIN / "flwr"), "ls", CONNECTION, "--run-id", str(run_id), "--format", "json"],
                            env=federation.env, capture_output=True, text=True, timeout=HANG_GUARD_S)
    return parse_ls(listed.stdout, run_id).status


def finished(proc: subprocess.Popen) -> tuple[int, str, str]:
    out, err = proc.communicate(timeout=HANG_GUARD_S)
    return proc.returncode, out, err


@pytest.fixture(scope="module")
def signed_federation(tmp_path_factory):
    """A TLS SuperLink behind the Fleet gateway and two SuperNodes that run only what the
    federation's key signed: the app staged from its packages (as ``deploy run`` stages it), signed."""
    from deploy.bundle import stage_app
    from deploy.federation import LocalFederation
    from deploy.pki import make_all
    from deploy.signing import make_signing_key, sign_app, write_trusted_entities

    tmp = tmp_path_factory.mktemp("signed-federation")
    make_all(tmp / "pki", 2)
    key, public = make_signing_key(tmp / "signer")
    signed = stage_app(tmp / "signed")
    sign_app(signed, key, tmp / "pki" / "signatures")
    trusted = write_trusted_entities([public], tmp / "trusted-entities.yaml")
    shards = _shards(tmp, 2)
    with LocalFederation(tmp / "fed", tmp / "pki") as federation:
        federation.start_superlink()
        federation.start_gateway(tmp / "pki" / "signatures")
        federation.start_nodes(shards, trusted_entities=trusted)
        federation.wait_until_ready(["supernode-0", "supernode-1"])
        yield federation, signed, {**SMALL, "eval-file": str(tmp / "eval.npz")}


@pytest.mark.deployment
@pytest.mark.slow
def test_a_signed_run_exits_0_with_its_result(signed_federation, tmp_path):
    federation, signed, config = signed_federation
    out = tmp_path / "result"
    code, stdout, stderr = finished(deploy_run(federation, signed, {**config, "out-dir": str(out)}))
    assert code == COMPLETED, stderr[-3000:]
    run_id = int(stdout.split()[1])
    assert stdout.startswith(f"run {run_id} submitted") and f"result: {out / 'result.json'}" in stdout  # the log
    assert f"report: {out / 'report.html'}" in stdout and (out / "report.html").is_file()  # the server's page
    assert stdout.rstrip().splitlines()[-1] == f"run {run_id} completed: result {out / 'result.json'} " \
                                               f"(log: {out / f'run-{run_id}.log'})"
    assert json.loads((out / "result.json").read_text())["strategy"] == "fedkmeans"
    assert f"result: {out / 'result.json'}" in (out / f"run-{run_id}.log").read_text()


@pytest.mark.deployment
@pytest.mark.slow
def test_an_app_the_supernodes_refuse_exits_4_where_flwr_run_exits_0(signed_federation, tmp_path):
    """One file more than the signed app: every SuperNode refuses it before any of its code runs."""
    from deploy.bundle import stage_app

    federation, _, config = signed_federation
    unsigned = stage_app(tmp_path)
    (unsigned / "app" / "changed.py").write_text("CHANGED = True\n")
    plain = federation.run_app(unsigned, {**config, "out-dir": str(tmp_path / "plain")}, timeout=HANG_GUARD_S)
    assert plain.returncode == 0  # the break: flwr run reports nothing
    assert not (tmp_path / "plain" / "result.json").exists()
    code, _, stderr = finished(deploy_run(federation, unsigned, {**config, "out-dir": str(tmp_path / "out")}))
    assert code == APP_REFUSED, stderr[-3000:]
    [line] = stderr.splitlines()
    assert line.startswith("error: run ") and "failed: the SuperNodes refused the app" in line, line
    assert "The FAB could not be verified" in line


@pytest.mark.deployment
@pytest.mark.slow
def test_a_node_policy_refusal_exits_5_naming_the_rule(tmp_path):
    """Both SuperNodes demand secure aggregation; a fedkmeans run in clear is refused at its first step."""
    from deploy.federation import LocalFederation
    from deploy.pki import make_all

    make_all(tmp_path / "pki", 2)
    shards = _shards(tmp_path, 2)
    with LocalFederation(tmp_path / "fed", tmp_path / "pki") as federation:
        federation.start_superlink()
        federation.start_configured_nodes([f"shard='{shard}' privacy.all.secure-aggregation=true"
                                           for shard in shards])
        federation.wait_until_ready(["supernode-0", "supernode-1"])
        config = {**SMALL, "eval-file": str(tmp_path / "eval.npz"), "out-dir": str(tmp_path / "out")}
        code, _, stderr = finished(deploy_run(federation, None, config))
    assert code == POLICY_REFUSED, stderr[-3000:]
    [line] = stderr.splitlines()
    assert "failed: a node's privacy policy refused it (rule secure-aggregation)" in line, line
    assert not (tmp_path / "out" / "result.json").exists()


@pytest.fixture(scope="module")
def bare_federation(tmp_path_factory):
    """A SuperLink without SuperNodes: a run waits there for its first node up to ``timeout`` (600 s)."""
    from deploy.federation import LocalFederation

    with LocalFederation(tmp_path_factory.mktemp("bare-federation"), None) as federation:
        federation.start_superlink()
        yield federation


@pytest.mark.deployment
@pytest.mark.slow
def test_a_run_someone_stops_exits_8(bare_federation, tmp_path):
    from deploy.federation import BIN, CONNECTION

    proc = deploy_run(bare_federation, None, {**SMALL, "out-dir": str(tmp_path / "out")})
    run_id = submitted_run(proc)
    wait_until(lambda: run_status(bare_federation, run_id) == "running", f"run {run_id} to run")
    stop = subprocess.run([str(BIN / "flwr"), "stop", str(run_id), CONNECTION], env=bare_federation.env,
                          capture_output=True, text=True, timeout=HANG_GUARD_S)
    assert stop.returncode == 0, stop.stdout + stop.stderr
    code, _, stderr = finished(proc)
    assert code == STOPPED, stderr[-3000:]
    assert stderr.startswith(f"error: run {run_id} was stopped before it finished") and len(stderr.splitlines()) == 1


@pytest.mark.deployment
@pytest.mark.slow
def test_a_run_followed_past_the_timeout_exits_11_and_goes_on(bare_federation, tmp_path):
    code, _, stderr = finished(deploy_run(bare_federation, None, {**SMALL, "out-dir": str(tmp_path / "out")},
                                          "--timeout", "5"))
    assert code == STILL_RUNNING, stderr[-3000:]
    found = re.match(r"error: run (\d+) still runs after 5 s \(flwr stop \1 stops it\)", stderr)
    assert found and len(stderr.splitlines()) == 1, stderr
    assert run_status(bare_federation, int(found.group(1))) == "running"


@pytest.mark.deployment
@pytest.mark.slow
def test_a_superlink_lost_mid_run_exits_10(tmp_path):
    from deploy.federation import LocalFederation

    with LocalFederation(tmp_path / "fed", None) as federation:
        federation.start_superlink()
        proc = deploy_run(federation, None, {**SMALL, "out-dir": str(tmp_path / "out")})
        run_id = submitted_run(proc)
        wait_until(lambda: run_status(federation, run_id) == "running", f"run {run_id} to run")
        federation.kill("superlink")
        code, _, stderr = finished(proc)
    assert code == SUPERLINK_LOST, stderr[-3000:]
    assert stderr.startswith(f"error: run {run_id}: the SuperLink stopped answering before the run finished")
    assert len(stderr.splitlines()) == 1
