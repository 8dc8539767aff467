"""Certificates for TLS and key pairs for SuperNode authentication.

``python -m deploy.pki --out DIR --nodes N [--host NAME_OR_IP ...]`` writes:

* ``ca.crt`` / ``ca.key``: a self-signed certificate authority (EC P-384).
  ``ca.crt`` goes to every SuperNode and to the ``flwr`` CLI; ``ca.key``
  stays with whoever runs the SuperLink, kept offline and apart from the
  results (it signs certificates every SuperNode trusts).
* ``superlink.crt`` / ``superlink.key``: the SuperLink's server certificate,
  signed by the CA, valid for ``localhost``, ``127.0.0.1`` and every ``--host``
  (the SuperLink's address as SuperNodes see it on other machines).
* ``supernode-<i>`` / ``supernode-<i>.pub``: one EC P-384 key pair per
  SuperNode in OpenSSH format, as ``flower-supernode
  --auth-supernode-private-key`` and ``flwr supernode register`` expect. Only
  the public key is registered with the SuperLink.

Every file is created by the call that writes it (``O_CREAT | O_EXCL | O_NOFOLLOW``), relative
to one descriptor of the key directory (what was checked is where the keys land): private keys
with mode 0600 from the start (no moment in which another local user could open them), the
key directory with mode 0700; an existing file is never overwritten (a planted symlink
neither). A key directory that is not the user's own or that others can write is refused, and so
is one below a directory another user could rename it in (OpenSSH's StrictModes rule: every
ancestor owned by root or the user, writable by others only with the sticky bit); one others can
read gets a warning.
"""

from __future__ import annotations

import argparse
import datetime as dt
import ipaddress
import os
import stat
import sys
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from fedgraphcore.errors import FedGraphError

VALID_DAYS = 365


#: what a key file is created with: 0600 for private keys; public files get 0666 less the umask
PRIVATE_MODE, PUBLIC_MODE = 0o600, 0o666


class KeyFileError(FedGraphError, ValueError):
    """A key or certificate file cannot be created safely (one line naming the path and the fix)."""

    exit_code = 2


_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
_CREATE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)


def _not_a_directory(parent_fd: int, name: str, shown: Path) -> KeyFileError:
    kind = "a symbolic link" if stat.S_ISLNK(os.lstat(name, dir_fd=parent_fd).st_mode) else "not a directory"
    return KeyFileError(f"{shown} is {kind}; valid: a directory (or a path where one can be created)")


def _open_dir(parent_fd: int, name: str, shown: Path) -> int:
    try:
        return os.open(name, _DIR_FLAGS, dir_fd=parent_fd)
    except NotADirectoryError:
        raise _not_a_directory(parent_fd, name, shown) from None
    except PermissionError:
        raise KeyFileError(f"{shown}: permission denied; valid: a directory you can enter") from None


def _open_or_make(parent_fd: int, name: str, shown: Path, mode: int) -> int:
    """The directory ``name`` in ``parent_fd``, opened without following a symlink; created with
    ``mode`` when missing."""
    try:
        return _open_dir(parent_fd, name, shown)
    except FileNotFoundError:
        pass
    try:
        os.mkdir(name, mode, dir_fd=parent_fd)
    except FileExistsError:
        pass  # made meanwhile by someone else: opened, then checked like any existing directory
    except PermissionError:
        raise KeyFileError(f"cannot create {shown}: permission denied; valid: a path below a directory you "
                           "can write") from None
    return _open_dir(parent_fd, name, shown)


def _check_ancestor(fd: int, shown: Path) -> None:
    """Nobody but root and this user may rename what lies in ``shown``: owned by one of them, and
    writable by group or others only with the sticky bit (like /tmp)."""
    info = os.fstat(fd)
    mode = stat.S_IMODE(info.st_mode)
    if info.st_uid not in (0, os.getuid()):
        raise KeyFileError(f"{shown} belongs to another user (uid {info.st_uid}), who could replace what lies in "
                           "it; valid: a path whose every directory is yours or root's")
    if mode & 0o022 and not mode & stat.S_ISVTX:
        raise KeyFileError(f"{shown} is writable by group or others without the sticky bit (mode {mode:o}): another "
                           f"user could rename what lies in it; valid: a path only you can change (chmod go-w {shown})")


def _check_own(fd: int, shown: Path, private: bool) -> None:
    info = os.fstat(fd)
    mode = stat.S_IMODE(info.st_mode)
    if info.st_uid != os.getuid():
        raise KeyFileError(f"{shown} belongs to another user (uid {info.st_uid}), who could replace a file in it; "
                           "valid: a directory of your own")
    if mode & 0o022:
        raise KeyFileError(f"{shown} is writable by group or others (mode {mode:o}): another user could replace a "
                           f"file in it; valid: a directory only you can write (chmod 700 {shown}) or a new one")
    if private and mode & 0o077:
        print(f"warning: key directory {shown} is readable by group or others (mode {mode:o}); the private keys "
              f"in it are 0600, their names are visible (chmod 700 {shown})", file=sys.stderr)


def open_directory(path: Path, private: bool = True) -> int:
    """A descriptor of the directory ``path`` for files no one else may replace, opened once:
    every component from ``/`` is opened relative to the one before without following a symlink
    (the parent's path is resolved first) and checked on that descriptor, so what is checked is
    what the caller writes into. Missing directories are created, ``path`` itself with mode 0700
    (``private``: for keys) or 0755, its parents 0755. ``path`` must be the user's own and not
    writable by group or others; each ancestor owned by root or the user and writable by others
    only with the sticky bit. A ``private`` one readable by others gets a warning on stderr."""
    path = Path(os.path.abspath(path))
    if path == path.parent:
        raise KeyFileError(f"{path} cannot hold keys; valid: a directory below /")
    parent = Path(os.path.realpath(path.parent))
    fd = os.open("/", _DIR_FLAGS)
    try:
        _check_ancestor(fd, Path("/"))
        shown = Path("/")
        for name in parent.parts[1:]:
            shown = shown / name
            child = _open_or_make(fd, name, shown, 0o755)
            os.close(fd)
            fd = child
            _check_ancestor(fd, shown)
        child = _open_or_make(fd, path.name, path, 0o700 if private else 0o755)
    finally:
        os.close(fd)
    try:
        _check_own(child, path, private)
    except BaseException:
        os.close(child)
        raise
    return child


def _exists(path: Path) -> KeyFileError:
    return KeyFileError(f"{path} already exists: keys and certificates are never overwritten; valid: a new "
                        "directory, or remove the old files first")


def create_file(dir_fd: int, name: str, data: bytes, mode: int, shown: Path) -> None:
    """Create ``name`` in the directory ``dir_fd`` with ``mode`` and write ``data`` through the
    descriptor that created it; KeyFileError naming ``shown`` if anything is there (O_EXCL, O_NOFOLLOW:
    a symlink is not followed either)."""
    try:
        fd = os.open(name, _CREATE_FLAGS, mode, dir_fd=dir_fd)
    except FileExistsError:
        raise _exists(shown) from None
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
    except BaseException:
        os.unlink(name, dir_fd=dir_fd)
        raise


def write_files(out: Path, files: dict[str, tuple[bytes, int]]) -> dict[str, Path]:
    """Create every file ``name: (data, mode)`` in the key directory ``out`` (:func:`open_directory`:
    each relative to its one descriptor), all or none: nothing is written when any of them exists
    (a symlink too, dangling or not), and the files this call created are removed when a later one
    fails. Their paths by name."""
    out = Path(out)
    dir_fd = open_directory(out)
    created: list[str] = []
    try:
        for name in files:
            try:
                os.lstat(name, dir_fd=dir_fd)
            except FileNotFoundError:
                continue
            raise _exists(out / name)
        for name, (data, mode) in files.items():
            create_file(dir_fd, name, data, mode, out / name)
            created.append(name)
    except BaseException:
        for name in created:
            os.unlink(name, dir_fd=dir_fd)
        raise
    finally:
        os.close(dir_fd)
    return {name: out / name for name in files}


def _pem_key(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def _san(host: str) -> x509.GeneralName:
    try:
        return x509.IPAddress(ipaddress.ip_address(host))
    except ValueError:
        return x509.DNSName(host)


def new_ca(name: str = "fedgraph federation CA") -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    """A new self-signed CA certificate and its key (in memory)."""
    key = ec.generate_private_key(ec.SECP384R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = dt.datetime.now(dt.timezone.utc)
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject).issuer_name(subject).public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5)).not_valid_after(now + dt.timedelta(days=VALID_DAYS))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                     content_commitment=False, key_encipherment=False,
                                     data_encipherment=False, key_agreement=False,
                                     encipher_only=False, decipher_only=False), critical=True)
        .sign(key, hashes.SHA384())
    )
    return cert, key


def server_files(ca_cert, ca_key, hosts: list[str]) -> dict[str, tuple[bytes, int]]:
    """``superlink.crt`` (signed by the CA, valid for localhost, 127.0.0.1 and ``hosts``) and ``superlink.key``."""
    key = ec.generate_private_key(ec.SECP384R1())
    now = dt.datetime.now(dt.timezone.utc)
    names = list(dict.fromkeys(["localhost", "127.0.0.1", *hosts]))
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, names[0])]))
        .issuer_name(ca_cert.subject).public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5)).not_valid_after(now + dt.timedelta(days=VALID_DAYS))
        .add_extension(x509.SubjectAlternativeName([_san(h) for h in names]), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .sign(ca_key, hashes.SHA384())
    )
    return {"superlink.crt": (cert.public_bytes(serialization.Encoding.PEM), PUBLIC_MODE),
            "superlink.key": (_pem_key(key), PRIVATE_MODE)}


def node_files(index: int) -> dict[str, tuple[bytes, int]]:
    """SuperNode ``index``'s authentication key pair in OpenSSH format: ``supernode-<index>`` and its ``.pub``."""
    key = ec.generate_private_key(ec.SECP384R1())
    private = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH,
                                serialization.NoEncryption())
    public = key.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
    return {f"supernode-{index}": (private, PRIVATE_MODE), f"supernode-{index}.pub": (public + b"\n", PUBLIC_MODE)}


def make_node_keys(out: Path, index: int) -> tuple[Path, Path]:
    """One SuperNode's key pair (:func:`node_files`) in the key directory ``out``; neither file may exist."""
    paths = write_files(out, node_files(index))
    return paths[f"supernode-{index}"], paths[f"supernode-{index}.pub"]


def make_all(out: Path, nodes: int, hosts: list[str] = (), keep_ca_key: bool = True) -> None:
    """``ca.crt``, ``ca.key`` when ``keep_ca_key`` (else the CA's key exists only in memory, to sign
    this call's certificates: no one can sign another later), the SuperLink's certificate and key
    and ``nodes`` SuperNode key pairs, in the key directory ``out``, all or none (:func:`write_files`)."""
    ca_cert, ca_key = new_ca()
    files = {"ca.crt": (ca_cert.public_bytes(serialization.Encoding.PEM), PUBLIC_MODE)}
    if keep_ca_key:
        files["ca.key"] = (_pem_key(ca_key), PRIVATE_MODE)
    files.update(server_files(ca_cert, ca_key, list(hosts)))
    for i in range(nodes):
        files.update(node_files(i))
    write_files(out, files)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m deploy.pki", description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--nodes", type=int, required=True, help="number of SuperNode key pairs")
    parser.add_argument("--host", action="append", default=[], help="extra SuperLink name/IP for the certificate")
    args = parser.parse_args(argv)
    if args.nodes < 0:
        parser.error(f"--nodes must be >= 0, got {args.nodes}")
    try:
        make_all(args.out, args.nodes, args.host)
    except (KeyFileError, OSError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(f"wrote CA, SuperLink certificate and {args.nodes} SuperNode key pairs to {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
