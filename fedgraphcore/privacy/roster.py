"""The federation's members and their identity keys: what lets a member trust a peer's key that
reached it through the server.

Every key a member advertises for secure aggregation (its X25519 key, whose pair keys also seal
the boundary links' group-key shares) travels through the server. Without more, a server that
replaces the keys it relays shares a pair seed with each member instead of its peers and unmasks
any single upload, and an operator who registers SuperNodes of its own (sybils) has them counted
towards a member's ``min-group``. So (Bonawitz et al. 2017, the malicious-server variant):

* each member holds an **identity key** (Ed25519, OpenSSH format, node config ``identity-key``)
  and the federation's **roster** (node config ``roster``: a YAML map of member name to OpenSSH
  public key, handed out of band like the app signer's key);
* a member **endorses** the key it advertises: its identity public key and an Ed25519 signature
  over :func:`key_statement` (the run, the secure-aggregation session, the step the key was
  advertised in, its party id, the run's parties and the key), 96 bytes;
* a member with a roster **checks** every relayed key (:func:`check_endorsed`): each peer's
  endorsement verifies, by a roster member, a different member for every party; otherwise it
  refuses the step (rule ``roster``) before any masked upload leaves it. Its ``min-group`` then
  counts roster members only: no party of the run is anyone else;
* before any share of a mask leaves it, a member with a roster checks that **every survivor of
  a sum signed the same survivor set** (:func:`consistency_statement`,
  :func:`check_consistency`), so that the server cannot tell members different sets.

Plain functions over bytes; no Flower imports. A node without a roster checks nothing here and
trusts the server's relay (an honest-but-curious server).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Mapping

import yaml
from cryptography.exceptions import InvalidSignature, UnsupportedAlgorithm
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from fedgraphcore.config import ConfigError
from fedgraphcore.privacy.policy import PrivacyRefusal

#: node config: the member's identity key (private, Ed25519 in OpenSSH format)
IDENTITY_KEY = "identity-key"
#: node config: the federation's roster (YAML: member name -> OpenSSH Ed25519 public key)
ROSTER_KEY = "roster"
#: the rules a refusal names
ROSTER_RULE, CONSISTENCY_RULE = "roster", "secagg-consistency"
RAW_KEY, SIGNATURE = 32, 64
#: an endorsement: the identity public key, then the signature
ENDORSEMENT = RAW_KEY + SIGNATURE
_LABEL = b"fedgraph/member-statement/v1\n"


def _raw(public: Ed25519PublicKey) -> bytes:
    return public.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


def public_bytes(identity: Ed25519PrivateKey) -> bytes:
    """The raw 32-byte public key of an identity key (as a roster holds it)."""
    return _raw(identity.public_key())


@dataclass(frozen=True)
class Roster:
    """The federation's members: name -> identity public key (raw 32 bytes)."""

    members: Mapping[str, bytes]

    def name_of(self, identity: bytes) -> str | None:
        """The member whose identity key is ``identity``, or None."""
        return next((name for name, raw in self.members.items() if raw == identity), None)


def load_roster(path: str | Path) -> Roster:
    """The roster at ``path``; a one-line ConfigError for an unreadable file, an entry that is not an
    Ed25519 public key in OpenSSH format, or one key listed under two names."""
    try:
        entries = yaml.safe_load(Path(path).read_text())
    except OSError as err:
        raise ConfigError(f"node config '{ROSTER_KEY}': cannot read {path}: {err.strerror}",
                          public=f"node config '{ROSTER_KEY}', rule 'a readable roster'") from None
    except yaml.YAMLError:
        entries = None
    if not isinstance(entries, dict) or not entries:
        raise ConfigError(f"node config '{ROSTER_KEY}': {path} is not a YAML map of member name to public key "
                          "('member-0: ssh-ed25519 AAAA...')", public=f"node config '{ROSTER_KEY}', rule 'a roster'")
    members = {str(name): _raw(_public_key(value, f"{path}: member {name!r}")) for name, value in entries.items()}
    if len(set(members.values())) != len(members):
        raise ConfigError(f"node config '{ROSTER_KEY}': {path} lists one key under two names; valid: one key a member",
                          public=f"node config '{ROSTER_KEY}', rule 'one key a member'")
    return Roster(members)


def _public_key(value, where: str) -> Ed25519PublicKey:
    try:
        key = serialization.load_ssh_public_key(str(value).encode())
    except (ValueError, UnsupportedAlgorithm):
        key = None
    if not isinstance(key, Ed25519PublicKey):
        raise ConfigError(f"{where} is not an Ed25519 public key in OpenSSH format (ssh-ed25519 AAAA...)",
                          public=f"node config '{ROSTER_KEY}', rule 'Ed25519 public keys'")
    return key


def load_identity(path: str | Path) -> Ed25519PrivateKey:
    """The member's identity key at ``path`` (``python -m deploy keygen`` writes one); a one-line
    ConfigError otherwise."""
    try:
        key = serialization.load_ssh_private_key(Path(path).read_bytes(), password=None)
    except OSError as err:
        raise ConfigError(f"node config '{IDENTITY_KEY}': cannot read {path}: {err.strerror}",
                          public=f"node config '{IDENTITY_KEY}', rule 'a readable key'") from None
    except (ValueError, TypeError, UnsupportedAlgorithm):
        key = None
    if not isinstance(key, Ed25519PrivateKey):
        raise ConfigError(f"node config '{IDENTITY_KEY}': {path} is not an unencrypted Ed25519 private key in "
                          "OpenSSH format", public=f"node config '{IDENTITY_KEY}', rule 'an Ed25519 key'")
    return key


def _statement(kind: str, **fields) -> bytes:
    return _LABEL + kind.encode() + b"\n" + json.dumps(fields, sort_keys=True, separators=(",", ":")).encode()


def key_statement(run: int, session: str, step: str, party: int, parties: int, key: bytes) -> bytes:
    """What an endorsement signs: party ``party`` of the run's ``parties`` advertises ``key`` in
    step ``step`` of secure-aggregation session ``session`` of run ``run``."""
    return _statement("key", run=int(run), session=str(session), step=str(step), party=int(party),
                      parties=int(parties), key=bytes(key).hex())


def endorse(identity: Ed25519PrivateKey, statement: bytes) -> bytes:
    """The 96-byte endorsement of ``statement``: the identity public key, then its signature."""
    return _raw(identity.public_key()) + identity.sign(statement)


def _verifies(identity: bytes, signature: bytes, statement: bytes) -> bool:
    try:
        Ed25519PublicKey.from_public_bytes(identity).verify(signature, statement)
    except (InvalidSignature, ValueError):
        return False
    return True


def check_endorsed(roster: Roster, me: int, own: bytes, endorsements: Mapping[int, bytes],
                   statements: Mapping[int, bytes]) -> dict[int, bytes]:
    """The identity key of every party (this party ``me``, identity ``own``, included), once each
    other party's endorsement of its statement (``statements[p]``: :func:`key_statement` of the key
    relayed for ``p``) verifies by a member of ``roster``, every party a different member.
    Raises :class:`PrivacyRefusal` (rule ``roster``) naming the first party that fails."""
    identities, seen = {me: bytes(own)}, {bytes(own): me}
    for party in sorted(statements):
        if party == me:
            continue
        endorsement = bytes(endorsements.get(party, b""))
        if len(endorsement) != ENDORSEMENT:
            raise PrivacyRefusal(ROSTER_RULE, f"party {party}'s key comes without an endorsement by a member's "
                                              "identity key")
        identity, signature = endorsement[:RAW_KEY], endorsement[RAW_KEY:]
        member = roster.name_of(identity)
        if member is None:
            raise PrivacyRefusal(ROSTER_RULE, f"party {party}'s key is endorsed by an identity not in this node's "
                                              "roster")
        if not _verifies(identity, signature, statements[party]):
            raise PrivacyRefusal(ROSTER_RULE, f"party {party}'s endorsement (member {member!r}) does not sign the key "
                                              "relayed for it in this run, step and set of parties")
        if identity in seen:
            raise PrivacyRefusal(ROSTER_RULE, f"member {member!r} endorses the keys of parties {seen[identity]} and "
                                              f"{party}; valid: one party a member")
        identities[party], seen[identity] = identity, party
    return identities


def consistency_statement(run: int, session: str, tag: str, survivors: Iterable[int],
                          dropped: Iterable[int]) -> bytes:
    """What a survivor of the sum ``tag`` signs before any share of a mask leaves it: the survivors
    and dropped parties it was told."""
    return _statement("survivors", run=int(run), session=str(session), tag=str(tag),
                      survivors=sorted(int(s) for s in survivors), dropped=sorted(int(d) for d in dropped))


def check_consistency(identities: Mapping[int, bytes], survivors: Iterable[int],
                      signatures: Mapping[int, bytes], statement: bytes) -> None:
    """Every survivor's signature (``signatures[p]``, 64 bytes) verifies over ``statement`` under its
    identity key; else :class:`PrivacyRefusal` (rule ``secagg-consistency``): the server told some
    survivor another set, or left one out."""
    for party in sorted(int(s) for s in survivors):
        signature = bytes(signatures.get(party, b""))
        if party not in identities or len(signature) != SIGNATURE or \
                not _verifies(identities[party], signature, statement):
            raise PrivacyRefusal(CONSISTENCY_RULE, f"survivor {party} did not sign the survivor set this party was "
                                                   "told: the server told members different sets, or left one out")
