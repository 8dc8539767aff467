"""Which signed app versions a member's SuperNode runs: pinned bundles, revoked ones, a minimum version.

A signature says who signed an app bundle, not that the member still wants it: an operator may
submit any version ever signed. A member therefore adds to its trust file (``flower-supernode
--trusted-entities``, :func:`deploy.signing.write_trusted_entities`; ``python -m deploy trust
... --min-version V --pin SHA256 --revoke SHA256``) one more entry beside the trusted keys::

    fpk_0123...: ssh-ed25519 AAAA...
    app-versions:
      minimum-version: "0.2.0"   # a bundle whose pyproject version is lower is refused
      pinned: [<sha256>, ...]    # when given: only these bundles run
      revoked: [<sha256>, ...]   # these never run

The SuperNode (``python -m deploy.flower_shim supernode``: :func:`enforce`) checks these rules
where Flower checks the bundle's signature (``_verify_fab``, before the run's context exists and
before any of the bundle's code runs), and refuses a bundle that breaks one with one line in its
log naming the bundle and the rule; Flower then answers every message of the run with its error
"The FAB could not be verified" (``python -m deploy run`` exits 4). Plain ``flower-supernode``
cannot read such a trust file and does not start (it takes every entry for a key), so a member's
rules are never silently ignored.
"""

from __future__ import annotations

import hashlib
import logging
import re
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from packaging.version import InvalidVersion, Version

from fedgraphcore.errors import FedGraphError

#: the trust file's entry holding the rules (every other entry is a trusted key)
VERSIONS_KEY = "app-versions"
_FIELDS = ("minimum-version", "pinned", "revoked")
_SHA256 = re.compile(r"^[0-9a-f]{64}$")


class AppVersionError(FedGraphError, ValueError):
    """A trust file's app-version rules that cannot be read (one line)."""


@dataclass(frozen=True)
class AppVersions:
    """A member's rules: the least version it runs, the only bundles it runs (None: any signed one),
    the bundles it never runs (SHA-256, hex)."""

    minimum: Version | None = None
    pinned: frozenset[str] | None = None
    revoked: frozenset[str] = frozenset()

    def as_entry(self) -> dict[str, Any]:
        """The trust file's ``app-versions`` entry."""
        entry: dict[str, Any] = {"revoked": sorted(self.revoked)}
        if self.minimum is not None:
            entry["minimum-version"] = str(self.minimum)
        if self.pinned is not None:
            entry["pinned"] = sorted(self.pinned)
        return entry

    def refusal(self, fab: bytes) -> str | None:
        """Why the bundle ``fab`` must not run, or None."""
        digest = hashlib.sha256(fab).hexdigest()
        if digest in self.revoked:
            return "revoked in the trust file"
        if self.pinned is not None and digest not in self.pinned:
            return "not among the trust file's pinned bundles"
        if self.minimum is not None:
            version = bundle_version(fab)
            if version is None or version < self.minimum:
                return f"version {version or 'unreadable'}, below the trust file's minimum-version {self.minimum}"
        return None


def bundle_version(fab: bytes) -> Version | None:
    """The version in a bundle's pyproject.toml (Flower's reader), None where it has none readable."""
    from flwr.common.config import get_fab_config, get_metadata_from_config

    try:
        return Version(get_metadata_from_config(get_fab_config(fab))[1])
    except (InvalidVersion, KeyError, TypeError, ValueError):
        return None


def app_versions(minimum: str | None = None, pinned: list[str] | None = None,
                 revoked: list[str] = ()) -> AppVersions:
    """Checked rules (an :class:`AppVersionError` naming a bad version or hash)."""
    try:
        least = None if minimum is None else Version(str(minimum))
    except InvalidVersion:
        raise AppVersionError(f"minimum-version {minimum!r}; valid: a version such as 0.2.0") from None
    for digest in [*(pinned or []), *revoked]:
        if not isinstance(digest, str) or not _SHA256.match(digest):
            raise AppVersionError(f"bundle hash {digest!r}; valid: 64 lowercase hex digits (python -m deploy sign "
                                  "prints it)")
    return AppVersions(least, None if pinned is None else frozenset(pinned), frozenset(revoked))


def split_trust(entries: dict) -> tuple[dict, AppVersions | None]:
    """A trust file's trusted keys (what Flower reads) and its app-version rules (None: none)."""
    keys = {k: v for k, v in entries.items() if k != VERSIONS_KEY}
    if VERSIONS_KEY not in entries:
        return keys, None
    rules = entries[VERSIONS_KEY]
    if not isinstance(rules, dict) or set(rules) - set(_FIELDS):
        raise AppVersionError(f"trust file entry '{VERSIONS_KEY}': {rules!r}; valid: a map of {', '.join(_FIELDS)}")
    if not keys:
        raise AppVersionError(f"a trust file with '{VERSIONS_KEY}' and no trusted key; valid: the signers' keys too")
    for name in ("pinned", "revoked"):
        if rules.get(name) is not None and not isinstance(rules[name], list):
            raise AppVersionError(f"trust file '{VERSIONS_KEY}.{name}': {rules[name]!r}; valid: a list of hashes")
    return keys, app_versions(rules.get("minimum-version"), rules.get("pinned"), rules.get("revoked") or [])


def enforce(cli: ModuleType, internal: ModuleType) -> None:
    """Make Flower's SuperNode read the rules from its trust file (``cli``:
    ``flwr.supernode.cli.flower_supernode``, whose ``_try_obtain_trusted_entities`` reads it) and
    refuse a bundle that breaks one where it verifies the bundle's signature (``internal``:
    ``flwr.supernode.start_client_internal``'s ``_verify_fab``)."""
    obtain, verify = cli._try_obtain_trusted_entities, internal._verify_fab
    rules: list[AppVersions] = []

    def trusted_entities(path):
        entries = obtain(path)
        if not entries:
            return entries
        try:
            keys, versions = split_trust(entries)
        except AppVersionError as err:
            raise SystemExit(f"error: --trusted-entities {path}: {err}") from None
        rules[:] = [versions] if versions else []
        return keys

    def verify_fab(fab, trusted) -> bool:
        why = rules[0].refusal(fab.content) if rules else None
        if why is not None:
            logging.getLogger("flwr").error("app bundle %s refused: %s", hashlib.sha256(fab.content).hexdigest(), why)
            return False
        return verify(fab, trusted)

    cli._try_obtain_trusted_entities = trusted_entities
    internal._verify_fab = verify_fab
