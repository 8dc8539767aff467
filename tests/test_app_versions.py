"""An operator rolling a member back to an old signed app version: the member's trust file pins,
revokes or sets a least version, and its SuperNode (Flower's own message intake,
``_pull_and_store_message``, as ``python -m deploy.flower_shim supernode`` runs it) refuses the old
bundle with one line; nothing of it runs."""

from __future__ import annotations

import hashlib
import importlib
import logging

import pytest
from flwr.app import Message, RecordDict
from flwr.cli.build import build_fab_from_disk
from flwr.supercore.run import Run
from flwr.supercore.task_identity import TaskIdentity
from flwr.supercore.fab import Fab
from flwr.supercore.inflatable.inflatable_object import get_object_tree
from flwr.supercore.object_store import ObjectStoreFactory
from flwr.supernode import start_client_internal
from flwr.supernode.nodestate.in_memory_nodestate import InMemoryNodeState

from deploy.__main__ import main
from deploy.bundle import stage_app
from deploy.app_versions import enforce
from deploy.signing import make_signing_key, sign_fab, verifications

RUN_ID = 7
flower_supernode = importlib.import_module("flwr.supernode.cli.flower_supernode")


@pytest.fixture(scope="module")
def bundles(tmp_path_factory):
    """The app at version 0.1.0 (old) and 0.2.0 (new), both signed by the federation's signer: their
    contents and hashes, the signer's public key and the signatures directory."""
    tmp = tmp_path_factory.mktemp("versions")
    key, public = make_signing_key(tmp / "signer")
    app = stage_app(tmp)
    pyproject = (app / "pyproject.toml").read_text()
    signed = {}
    for version in ("0.1.0", "0.2.0"):
        (app / "pyproject.toml").write_text(pyproject.replace('version = "0.1.0"', f'version = "{version}"', 1))
        content = build_fab_from_disk(app)
        signed[version] = (content, sign_fab(content, key, tmp / "signatures"))
    return signed, public, tmp / "signatures"


@pytest.fixture
def supernode(monkeypatch):
    """Flower's SuperNode modules with the shim's app-version rules (``deploy.flower_shim``'s
    supernode role applies :func:`deploy.app_versions.enforce`), undone after the test."""
    monkeypatch.setattr(flower_supernode, "_try_obtain_trusted_entities", flower_supernode._try_obtain_trusted_entities)
    monkeypatch.setattr(start_client_internal, "_verify_fab", start_client_internal._verify_fab)
    enforce(flower_supernode, start_client_internal)
    for name, value in (("_run_id", RUN_ID), ("_node_id", 0), ("_task_id", RUN_ID)):  # the ServerApp's message
        monkeypatch.setattr(TaskIdentity, name, value, raising=False)


def receive(trust_file, content: bytes, fab_hash: str, signatures) -> tuple[InMemoryNodeState, bool]:
    """A message of a run of the bundle ``content`` reaching a SuperNode started with
    ``--trusted-entities trust_file``: its state afterwards, and whether a task was made for it."""
    trusted = flower_supernode._try_obtain_trusted_entities(trust_file)
    store = ObjectStoreFactory().store()
    state = InMemoryNodeState(store)
    state.set_node_id(1)
    message = Message(RecordDict(), dst_node_id=1, message_type="query.hello")
    message.metadata.__dict__["_run_id"] = RUN_ID
    run = Run.create_empty(RUN_ID)
    run.fab_hash = fab_hash
    fab = Fab(fab_hash, content, verifications(signatures, fab_hash))
    made = []
    state.create_task = lambda **kwargs: made.append(kwargs)
    start_client_internal._pull_and_store_message(
        state, store, {}, lambda: (message, get_object_tree(message)), lambda run_id: run,
        lambda fab_hash_, run_id: fab, lambda run_id, obj: b"", lambda run_id, mid: None, trusted)
    return state, bool(made)


@pytest.mark.parametrize("rule", [["--revoke", "OLD"], ["--min-version", "0.2.0"], ["--pin", "NEW"]])
def test_an_old_signed_bundle_is_refused_with_one_line_and_nothing_of_it_runs(bundles, supernode, tmp_path, rule,
                                                                              caplog):
    """The operator submits the old bundle, signed as it was: the member whose trust file revokes it,
    asks for 0.2.0 at least, or pins the new one refuses it where Flower checks the signature (no
    run context, no task: none of its code runs; one log line naming the bundle and the rule); the
    new bundle runs. Without the rule, the old one ran."""
    signed, public, signatures = bundles
    (old, old_hash), (new, new_hash) = signed["0.1.0"], signed["0.2.0"]
    arguments = [{"OLD": old_hash, "NEW": new_hash}.get(a, a) for a in rule]
    trust_file = tmp_path / "trusted-entities.yaml"
    assert main(["trust", "--out", str(trust_file), str(public), *arguments]) == 0
    with caplog.at_level(logging.ERROR):
        state, ran = receive(trust_file, old, old_hash, signatures)
    assert not ran and state.get_run(RUN_ID) is None
    refused = [r.getMessage() for r in caplog.records if "refused" in r.getMessage()]
    assert len(refused) == 1 and refused[0].startswith(f"app bundle {old_hash} refused: ")
    state, ran = receive(trust_file, new, new_hash, signatures)
    assert ran and state.get_run(RUN_ID) is not None


def test_without_rules_every_signed_version_runs(bundles, supernode, tmp_path):
    signed, public, signatures = bundles
    trust_file = tmp_path / "trusted-entities.yaml"
    assert main(["trust", "--out", str(trust_file), str(public)]) == 0
    for content, fab_hash in signed.values():
        assert receive(trust_file, content, fab_hash, signatures)[1]


def test_bad_rules_are_refused_in_one_line_and_nothing_is_written(bundles, tmp_path, capsys):
    _, public, _ = bundles
    trust_file = tmp_path / "trusted-entities.yaml"
    for rule, message in ((["--min-version", "two"], "minimum-version 'two'; valid: a version such as 0.2.0"),
                          (["--revoke", "abc"], "bundle hash 'abc'; valid: 64 lowercase hex digits")):
        assert main(["trust", "--out", str(trust_file), str(public), *rule]) == 2
        assert message in capsys.readouterr().err
    assert not trust_file.exists()


def test_a_trust_file_with_rules_but_no_key_stops_the_supernode(supernode, tmp_path):
    """Rules without a signer's key would leave Flower nothing to verify with: the SuperNode does not start."""
    trust_file = tmp_path / "trusted-entities.yaml"
    trust_file.write_text(f"app-versions:\n  revoked: ['{hashlib.sha256(b'x').hexdigest()}']\n")
    with pytest.raises(SystemExit, match="'app-versions' and no trusted key"):
        flower_supernode._try_obtain_trusted_entities(trust_file)
