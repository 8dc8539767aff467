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

Private keys are written with mode 0600.
"""

from __future__ import annotations

import argparse
import datetime as dt
import ipaddress
import os
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

VALID_DAYS = 365


def _write(path: Path, data: bytes, private: bool = False) -> None:
    path.write_bytes(data)
    if private:
        os.chmod(path, 0o600)


def _pem_key(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def _san(host: str) -> x509.GeneralName:
    try:
        return x509.IPAddress(ipaddress.ip_address(host))
    except ValueError:
        return x509.DNSName(host)


def make_ca(out: Path, name: str = "fedgraph federation CA",
            keep_key: bool = True) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    """A new CA: ``ca.crt`` in ``out``, and ``ca.key`` when ``keep_key`` (else the key exists only
    in memory, to sign this run's certificates: no one can sign another later)."""
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
    _write(out / "ca.crt", cert.public_bytes(serialization.Encoding.PEM))
    if keep_key:
        _write(out / "ca.key", _pem_key(key), private=True)
    return cert, key


def make_server_cert(out: Path, ca_cert, ca_key, hosts: list[str]) -> None:
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
    _write(out / "superlink.crt", cert.public_bytes(serialization.Encoding.PEM))
    _write(out / "superlink.key", _pem_key(key), private=True)


def make_node_keys(out: Path, index: int) -> tuple[Path, Path]:
    """One SuperNode's authentication key pair (OpenSSH format)."""
    key = ec.generate_private_key(ec.SECP384R1())
    private = out / f"supernode-{index}"
    public = out / f"supernode-{index}.pub"
    _write(private, key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH,
                                      serialization.NoEncryption()), private=True)
    _write(public, key.public_key().public_bytes(serialization.Encoding.OpenSSH,
                                                 serialization.PublicFormat.OpenSSH) + b"\n")
    return private, public


def make_all(out: Path, nodes: int, hosts: list[str] = (), keep_ca_key: bool = True) -> None:
    out.mkdir(parents=True, exist_ok=True)
    ca_cert, ca_key = make_ca(out, keep_key=keep_ca_key)
    make_server_cert(out, ca_cert, ca_key, list(hosts))
    for i in range(nodes):
        make_node_keys(out, i)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m deploy.pki", description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--nodes", type=int, required=True, help="number of SuperNode key pairs")
    parser.add_argument("--host", action="append", default=[], help="extra SuperLink name/IP for the certificate")
    args = parser.parse_args(argv)
    if args.nodes < 0:
        parser.error(f"--nodes must be >= 0, got {args.nodes}")
    make_all(args.out, args.nodes, args.host)
    print(f"wrote CA, SuperLink certificate and {args.nodes} SuperNode key pairs to {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
