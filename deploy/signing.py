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

* :func:`make_signing_key`: an Ed25519 key pair ``<name>`` / ``<name>.pub`` (OpenSSH), the
  private key created with mode 0600.
* :func:`sign_app`: builds the FAB with Flower's own builder (the bytes ``flwr run
  APP`` submits: the build is deterministic) and signs it (:func:`sign_fab`), which
  writes ``<sha256>.json`` into a signatures directory: ``{key_id: {"signature": base64url, "signed_at": unix time}}``,
  one entry per signer (Flower's verification record format). The directory must be the
  signer's own and not writable by others (:func:`deploy.pki.open_directory`).
* :func:`write_trusted_entities`: the ``--trusted-entities`` YAML for public keys (and the member's
  rules on which signed versions run, :mod:`deploy.app_versions`).
* :func:`write_roster`: the members' roster (node config ``roster``) for their identity public keys.
* :func:`verifications`: the records the gateway attaches to a FAB (none if unsigned).
"""

from __future__ import annotations

import base64
import errno
import hashlib
import json
import os
import secrets
import time
from pathlib import Path

import yaml
from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519
from flwr.cli.build import build_fab_from_disk
from flwr.supercore.primitives.asymmetric_ed25519 import create_message_to_sign, load_private_key, sign_message

from deploy.app_versions import VERSIONS_KEY, AppVersions
from deploy.pki import PRIVATE_MODE, PUBLIC_MODE, KeyFileError, create_file, open_directory, write_files

#: Flower's SuperNode reads the records only when this entry is non-empty (Flower Hub sets it)
VERIFIED_ENTRY = "valid_license"


def make_signing_key(out: Path, name: str = "app-signing") -> tuple[Path, Path]:
    """An Ed25519 key pair in OpenSSH format: ``out/<name>`` (created with mode 0600) and
    ``out/<name>.pub``, in the key directory ``out`` (:func:`deploy.pki.write_files`: neither
    file may exist; ``name`` is a plain file name)."""
    if not name or name != Path(name).name or name.startswith(".") or name.endswith(".pub"):
        raise KeyFileError(f"key name {name!r}; valid: a plain file name (no '/', not starting with '.', "
                           "not ending in '.pub'), e.g. 'app-signing'")
    key = ed25519.Ed25519PrivateKey.generate()
    paths = write_files(out, {
        name: (key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH,
                                 serialization.NoEncryption()), PRIVATE_MODE),
        f"{name}.pub": (key.public_key().public_bytes(serialization.Encoding.OpenSSH,
                                                      serialization.PublicFormat.OpenSSH) + b"\n", PUBLIC_MODE)})
    return paths[name], paths[f"{name}.pub"]


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
    signature by another key for the same FAB stays beside this one. ``signatures`` is checked
    like a key directory (:func:`deploy.pki.open_directory`: the user's own, nobody else can
    replace a file in it) and every file in it is reached through that one descriptor, never
    through a symlink."""
    key = _load_private(Path(private_key))
    digest = hashlib.sha256(fab)
    signed_at = int(time.time())
    signature = sign_message(key, create_message_to_sign(digest.digest(), signed_at))
    name, signatures = f"{digest.hexdigest()}.json", Path(signatures)
    dir_fd = open_directory(signatures, private=False)
    try:
        records = _read_records(dir_fd, name, signatures / name)
        records[key_id(key.public_key())] = {
            "signature": base64.urlsafe_b64encode(signature).rstrip(b"=").decode("ascii"),
            "signed_at": signed_at,
        }
        _replace(dir_fd, name, (json.dumps(records, indent=1, sort_keys=True) + "\n").encode(), signatures / name)
    finally:
        os.close(dir_fd)
    return digest.hexdigest()


def _read_records(dir_fd: int, name: str, shown: Path) -> dict:
    """The records in ``name`` (none when it is missing); a symlink there is refused, not followed."""
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
    except FileNotFoundError:
        return {}
    except OSError as err:
        if err.errno != errno.ELOOP:
            raise
        raise KeyFileError(f"{shown} is a symbolic link; valid: the regular file signing writes (remove the "
                           "link and sign again)") from None
    with os.fdopen(fd, "rb") as f:
        return json.loads(f.read())


def _replace(dir_fd: int, name: str, data: bytes, shown: Path) -> None:
    """``name`` in ``dir_fd`` replaced in one step by a file holding ``data``: written first under a
    new random name (O_EXCL, O_NOFOLLOW), then renamed over it."""
    tmp = f".{name}.{secrets.token_hex(8)}.tmp"
    create_file(dir_fd, tmp, data, PUBLIC_MODE, shown.with_name(tmp))
    try:
        os.replace(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except BaseException:
        os.unlink(tmp, dir_fd=dir_fd)
        raise


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


def write_trusted_entities(public_keys: list[Path], path: Path, versions: AppVersions | None = None) -> Path:
    """The ``flower-supernode --trusted-entities`` file trusting exactly these keys, and with
    ``versions`` the member's rules on which signed versions run (:mod:`deploy.app_versions`). It
    decides which code a SuperNode runs, so its folder is checked like a key directory
    (:func:`deploy.pki.open_directory`) and the file is replaced in one step, never through a symlink."""
    keys = [_load_public(Path(public)) for public in public_keys]
    entries = {key_id(key): _openssh(key) for key in keys}
    return _write_yaml({**entries, VERSIONS_KEY: versions.as_entry()} if versions else entries, path)


def write_roster(public_keys: list[Path], path: Path) -> Path:
    """The federation's roster (node config ``roster``, :mod:`fedgraphcore.privacy.roster`): each member's
    identity public key (``python -m deploy keygen --name NAME`` writes ``NAME.pub``) under its name,
    the file name without ``.pub``. Written like the trusted entities (:func:`write_trusted_entities`)."""
    entries = {Path(public).name.removesuffix(".pub"): _openssh(_load_public(Path(public))) for public in public_keys}
    if len(entries) != len(public_keys) or len(set(entries.values())) != len(entries):
        raise ValueError("a roster lists each member once, under one name, with a key of its own; got the keys "
                         + ", ".join(str(p) for p in public_keys))
    return _write_yaml(entries, path)


def _openssh(key: ed25519.Ed25519PublicKey) -> str:
    return key.public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH).decode("ascii")


def _write_yaml(entries: dict, path: Path) -> Path:
    path = Path(path)
    dir_fd = open_directory(path.parent, private=False)
    try:
        _replace(dir_fd, path.name, yaml.safe_dump(entries, sort_keys=True).encode(), path)
    finally:
        os.close(dir_fd)
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
