"""App signing and the Fleet gateway's verification records, checked with Flower's own
SuperNode verification (``_verify_fab``, what ``--trusted-entities`` runs)."""

from __future__ import annotations

import hashlib

import pytest
import yaml
from flwr.cli.build import build_fab_from_disk
from flwr.proto.fab_pb2 import GetFabResponse  # pylint: disable=no-name-in-module
from flwr.supercore.fab import Fab
from flwr.supernode.start_client_internal import _verify_fab

from conftest import REPO
from deploy.__main__ import main
from deploy.bundle import stage_app
from deploy.gateway import signed_fab
from deploy.signing import VERIFIED_ENTRY, make_signing_key, sign_fab, verifications, write_trusted_entities


@pytest.fixture(scope="module")
def signed(tmp_path_factory):
    """The repository's app as ``flwr run .`` builds it, signed by one key; a second key signs nothing."""
    tmp = tmp_path_factory.mktemp("signing")
    key, public = make_signing_key(tmp / "signer")
    _, other_public = make_signing_key(tmp / "other")
    content = build_fab_from_disk(REPO)  # Flower's builder walks the whole tree, .venv too: once
    fab_hash = sign_fab(content, key, tmp / "signatures")
    return tmp, content, fab_hash, public, other_public


def trusted(tmp, *public_keys) -> dict[str, str]:
    return yaml.safe_load(write_trusted_entities(list(public_keys), tmp / "trusted.yaml").read_text())


def test_a_supernode_verifies_the_signed_app_and_nothing_else(signed):
    tmp, content, fab_hash, public, other_public = signed
    assert hashlib.sha256(content).hexdigest() == fab_hash
    records = verifications(tmp / "signatures", fab_hash)
    assert records[VERIFIED_ENTRY] == "Valid"
    assert _verify_fab(Fab(fab_hash, content, records), trusted(tmp, public))
    assert not _verify_fab(Fab(fab_hash, content, records), trusted(tmp, other_public))  # not whom it trusts
    changed = content + b"\0"  # another app (or one byte of this one changed) under the same records
    assert not _verify_fab(Fab(hashlib.sha256(changed).hexdigest(), changed, records), trusted(tmp, public))
    assert verifications(tmp / "signatures", "0" * 64) == {}  # unsigned: nothing for the SuperNode to check
    assert verifications(tmp / "signatures", "../../etc/passwd") == {}


def test_the_gateway_replaces_whatever_records_a_fab_came_with(signed):
    tmp, _, fab_hash, _, _ = signed
    response = GetFabResponse()
    response.fab.hash_str = "f" * 64
    response.fab.content = b"a stranger's app"
    response.fab.verifications.update({"fpk_forged": '{"signature": "x", "signed_at": 1}', VERIFIED_ENTRY: "Valid"})
    out = GetFabResponse()
    out.ParseFromString(signed_fab(response.SerializeToString(), tmp / "signatures"))
    assert dict(out.fab.verifications) == {} and out.fab.content == b"a stranger's app"
    response.fab.hash_str = fab_hash
    out.ParseFromString(signed_fab(response.SerializeToString(), tmp / "signatures"))
    assert dict(out.fab.verifications) == verifications(tmp / "signatures", fab_hash)


def test_signing_cli_errors_are_one_line(signed, tmp_path, capsys):
    tmp, _, _, public, _ = signed
    assert main(["sign", "--key", str(public), "--signatures", str(tmp_path / "s")]) == 2
    assert capsys.readouterr().err == f"error: {public}: not an unencrypted Ed25519 private key in OpenSSH format\n"
    assert main(["trust", "--out", str(tmp_path / "t.yaml"), str(tmp / "signer" / "app-signing")]) == 2
    assert "not an Ed25519 public key in OpenSSH format" in capsys.readouterr().err


def test_the_staged_app_is_the_bundle_flwr_run_builds_in_the_checkout(signed, tmp_path):
    """What ``deploy local``, ``deploy sign`` and ``deploy run`` build from (the app's packages as
    imported, and its pyproject.toml) is byte for byte the checkout's ``flwr run .`` bundle."""
    _, content, fab_hash, _, _ = signed
    staged = build_fab_from_disk(stage_app(tmp_path))
    assert hashlib.sha256(staged).hexdigest() == fab_hash and staged == content


def test_staging_never_replaces_a_folder_that_is_not_a_staged_app(tmp_path, capsys):
    """``deploy stage --out .`` in a checkout must not wipe the checkout's ``app`` package."""
    (tmp_path / "app").mkdir()
    (tmp_path / "app" / "work.py").write_text("precious = True\n")
    assert main(["stage", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "is not a staged app" in err and len(err.splitlines()) == 1
    assert (tmp_path / "app" / "work.py").read_text() == "precious = True\n"
    staged = stage_app(tmp_path / "out")
    (staged / "deploy" / "bundle.py").write_text("")
    assert stage_app(tmp_path / "out") == staged  # an earlier staging is replaced
    assert (staged / "deploy" / "bundle.py").stat().st_size > 0


def test_trusted_entities_replace_a_planted_symlink_never_write_through_it(tmp_path):
    """The file that decides which code a SuperNode runs: a symlink planted at its name is replaced,
    its target left as it was; a folder others can write is refused."""
    _, public = make_signing_key(tmp_path / "signer")
    victim = tmp_path / "victim.yaml"
    victim.write_text("untouched\n")
    folder = tmp_path / "member"
    folder.mkdir(mode=0o755)
    (folder / "trusted.yaml").symlink_to(victim)
    written = write_trusted_entities([public], folder / "trusted.yaml")
    assert not written.is_symlink() and len(yaml.safe_load(written.read_text())) == 1
    assert victim.read_text() == "untouched\n"
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    with pytest.raises(ValueError, match=r"shared is writable by group or others \(mode 777\)"):
        write_trusted_entities([public], shared / "trusted.yaml")
