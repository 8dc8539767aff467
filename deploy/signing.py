"""App signing: a member's SuperNode runs only the app versions the federation signed.

Flower's SuperNode verifies an app bundle (FAB) before it runs any of its code
when started with ``--trusted-entities FILE`` (a YAML map of public key ids to
Ed25519 public keys in OpenSSH format): it needs, among the FAB's verification
records, a signature by one of those keys over Flower's message
``signed_at (8 bytes, big-endian) || sha256(FAB)``
(:func:`flwr.supercore.primitives.asymmetric_ed25519.create_message_to_sign`),
and refuses the FAB otherwise (an error reply to every message of the run; its
ClientApp never starts). Flower 1.41 / 1.42 attach such records only to apps
fetched from Flower Hub; here the signer writes them next to the federation's
PKI and the Fleet gateway (:mod:`deploy.gateway`) hands them to the SuperNodes
with the FAB. Whoever can reach the SuperLink can therefore still submit a run,
but no SuperNode that trusts only the federation's keys will execute it.

* :func:`make_signing_key`: an Ed25519 key pair ``<name>`` / ``<name>.pub`` (OpenSSH).
* :func:`sign_app`: builds the FAB with Flower's own builder (the bytes ``flwr run
  APP`` submits: the build is deterministic) and signs it (:func:`sign_fab`), which
  writes ``<sha256>.json`` into a signatures directory: ``{key_id: {"signature": base64url, "signed_at": unix time}}``,
  one entry per signer (Flower's verification record format).
* :func:`write_trusted_entities`: the ``--trusted-entities`` YAML for public keys.
* :func:`verifications`: the records the gateway attaches to a FAB (none if unsigned).
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import time
from pathlib import Path

import yaml
from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519
from flwr.cli.build import build_fab_from_disk
from flwr.supercore.primitives.asymmetric_ed25519 import create_message_to_sign, load_private_key, sign_message

#: Flower's SuperNode reads the records only when this entry is non-empty (Flower Hub sets it)
VERIFIED_ENTRY = "valid_license"


def make_signing_key(out: Path, name: str = "app-signing") -> tuple[Path, Path]:
    """An Ed25519 key pair in OpenSSH format: ``out/<name>`` (mode 0600) and ``out/<name>.pub``."""
    out.mkdir(parents=True, exist_ok=True)
    key = ed25519.Ed25519PrivateKey.generate()
    private, public = out / name, out / f"{name}.pub"
    private.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH,
                                          serialization.NoEncryption()))
    os.chmod(private, 0o600)
    public.write_bytes(key.public_key().public_bytes(serialization.Encoding.OpenSSH,
                                                     serialization.PublicFormat.OpenSSH) + b"\n")
    return private, public


def key_id(public_key: ed25519.Ed25519PublicKey) -> str:
    """A stable id for a signing key: ``fpk_`` and the first 24 hex digits of the SHA-256 of its raw bytes."""
    raw = public_key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return "fpk_" + hashlib.sha256(raw).hexdigest()[:24]


def _load_public(path: Path) -> ed25519.Ed25519PublicKey:
    try:
        key = serialization.load_ssh_public_key(path.read_bytes())
    except (ValueError, UnsupportedAlgorithm):
        key = None
    if not isinstance(key, ed25519.Ed25519PublicKey):
        raise ValueError(f"{path}: not an Ed25519 public key in OpenSSH format (ssh-ed25519 AAAA...)")
    return key


def _load_private(path: Path) -> ed25519.Ed25519PrivateKey:
    try:
        return load_private_key(path)
    except (ValueError, UnsupportedAlgorithm):
        raise ValueError(f"{path}: not an unencrypted Ed25519 private key in OpenSSH format") from None


def sign_fab(fab: bytes, private_key: Path, signatures: Path) -> str:
    """Sign the FAB ``fab`` into ``signatures/<sha256>.json``; return its SHA-256 (hex). A
    signature by another key for the same FAB stays beside this one."""
    key = _load_private(Path(private_key))
    digest = hashlib.sha256(fab)
    signed_at = int(time.time())
    signature = sign_message(key, create_message_to_sign(digest.digest(), signed_at))
    signatures.mkdir(parents=True, exist_ok=True)
    path = signatures / f"{digest.hexdigest()}.json"
    records = json.loads(path.read_text()) if path.exists() else {}
    records[key_id(key.public_key())] = {
        "signature": base64.urlsafe_b64encode(signature).rstrip(b"=").decode("ascii"),
        "signed_at": signed_at,
    }
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(records, indent=1, sort_keys=True) + "\n")
    tmp.replace(path)
    return digest.hexdigest()


def sign_app(app_dir: Path, private_key: Path, signatures: Path) -> str:
    """Sign the FAB ``flwr run app_dir`` submits (:func:`sign_fab`); return its SHA-256.
    Signatures written inside the app would change that FAB: then it is built again and
    must not have changed."""
    app_dir = Path(app_dir).resolve()
    _load_private(Path(private_key))  # a bad key fails before the build
    digest = sign_fab(build_fab_from_disk(app_dir), private_key, signatures)
    if Path(signatures).resolve().is_relative_to(app_dir) and \
            hashlib.sha256(build_fab_from_disk(app_dir)).hexdigest() != digest:
        (Path(signatures) / f"{digest}.json").unlink()
        raise ValueError(f"the app in {app_dir} changed while it was signed: {signatures} lies inside it and "
                         "its .gitignore does not exclude it; keep the signatures outside the app")
    return digest


def write_trusted_entities(public_keys: list[Path], path: Path) -> Path:
    """The ``flower-supernode --trusted-entities`` file trusting exactly these keys."""
    entries = {}
    for public in public_keys:
        key = _load_public(Path(public))
        entries[key_id(key)] = key.public_bytes(serialization.Encoding.OpenSSH,
                                                serialization.PublicFormat.OpenSSH).decode("ascii")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(entries, sort_keys=True))
    return path


def verifications(signatures: Path, fab_hash: str) -> dict[str, str]:
    """The verification records of the FAB with SHA-256 ``fab_hash`` as Flower's ``Fab``
    carries them (``{key_id: json}`` and the entry that tells the SuperNode to check
    them); empty when nobody signed it (a SuperNode with trusted entities then refuses it)."""
    if not all(c in "0123456789abcdef" for c in fab_hash) or len(fab_hash) != 64:
        return {}
    path = Path(signatures) / f"{fab_hash}.json"
    if not path.exists():
        return {}
    records = json.loads(path.read_text())
    return {**{kid: json.dumps(record) for kid, record in records.items()}, VERIFIED_ENTRY: "Valid"}
