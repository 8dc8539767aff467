"""Who may hold what at the Fleet gateway (:mod:`deploy.gateway`): connection slots by client
address, request bodies by registered SuperNode.

A stranger and a registered SuperNode look alike until the SuperLink has answered one of the
node's requests: only a node whose key the SuperLink registered gets a 200 (``flower-superlink
--enable-supernode-auth`` checks every Fleet request's signed timestamp and its node id). So:

* :class:`Members` keeps the public keys the SuperLink answered 200, and tells whether a request
  comes from one of them: its ``flwr-public-key`` is such a key, and its ``flwr-signature`` over
  its ``flwr-timestamp`` verifies under it within Flower's time window (the gateway checks what
  the SuperLink would, so a copied public key does not pass);
* :class:`Slots` counts connections from the TCP accept: at most ``total``, and per client address
  at most ``per_client`` not yet *proven* (no 200 answered on them yet); a proven connection, a
  registered node's, no longer counts against its address and is never taken back. When every slot
  is held, a newcomer takes the slot of the oldest unproven connection of the address that holds
  the most unproven ones, if that address holds more than one beyond the newcomer's: addresses
  that fill the slots give them up to others;
* :class:`Arrivals` lets each address start at most :data:`HANDSHAKES_PER_S` TLS handshakes a
  second (a burst of its connection limit): a handshake costs the gateway a signature, a refusal
  before it next to nothing, so addresses reconnecting as fast as they are answered cannot take its
  CPU;
* :class:`Quota` budgets the bodies of registered nodes' larger requests, by node key;
* :class:`LogBudget` keeps the log to :data:`LOG_LINES` one-line notes a minute.
"""

from __future__ import annotations

import base64
import binascii
import datetime
import ipaddress
import logging
import time
from collections import Counter, OrderedDict
from dataclasses import dataclass
from typing import Callable, Mapping

from flwr.common.constant import SYSTEM_TIME_TOLERANCE, TIMESTAMP_HEADER, TIMESTAMP_TOLERANCE
from flwr.supercore.constant import FLEET_HTTP_PUBLIC_KEY_HEADER, FLEET_HTTP_SIGNATURE_HEADER
from flwr.supercore.date import now
from flwr.supercore.primitives.asymmetric import bytes_to_public_key, verify_signature

LOG_LINES, LOG_WINDOW_S, LOG_LINE_CHARS = 20, 60.0, 300
#: new connections (TLS handshakes) one address may start a second, on average
HANDSHAKES_PER_S = 4.0
#: addresses whose recent arrivals are remembered (the least recent forgotten first)
KNOWN_ADDRESSES = 1 << 16
#: the public keys of registered nodes remembered (the least recently answered forgotten first)
KNOWN_KEYS = 4096
log = logging.getLogger("deploy.gateway")
_KEY, _SIGNATURE, _TIMESTAMP = (name.encode() for name in (FLEET_HTTP_PUBLIC_KEY_HEADER, FLEET_HTTP_SIGNATURE_HEADER,
                                                           TIMESTAMP_HEADER))


def one_line(text: str, limit: int = LOG_LINE_CHARS) -> str:
    """``text`` as one line of at most ``limit`` characters: unprintable characters escaped
    (``\\n``, ``\\x1b``), an overflow cut to ``...``."""
    line = "".join(c if c.isprintable() else repr(c)[1:-1] for c in text[:limit])
    return line if len(line) <= limit and len(text) <= limit else line[:limit - 3] + "..."


class LogBudget:
    """At most ``lines`` log lines per ``window_s`` seconds, each :func:`one_line`; the number left
    out is logged with the first line of a later window."""

    def __init__(self, lines: int = LOG_LINES, window_s: float = LOG_WINDOW_S, clock=time.monotonic) -> None:
        self.lines, self.window_s, self.clock = lines, window_s, clock
        self.start, self.used, self.left_out = clock(), 0, 0

    def __call__(self, message: str) -> None:
        now = self.clock()
        if now - self.start >= self.window_s:
            if self.left_out:
                log.warning("%d more lines left out in %g s", self.left_out, now - self.start)
            self.start, self.used, self.left_out = now, 0, 0
        if self.used < self.lines:
            self.used += 1
            log.warning("%s", one_line(message))
        else:
            self.left_out += 1


def client_of(host: str) -> str:
    """Whom a connection from ``host`` counts against: the IPv4 address (an IPv4-mapped IPv6 one
    too), or the /64 of an IPv6 address, the block one host gets."""
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return host
    if isinstance(address, ipaddress.IPv6Address):
        if address.ipv4_mapped is None:
            return str(ipaddress.IPv6Network((int(address) >> 64 << 64, 64)))
        address = address.ipv4_mapped
    return str(address)


class Quota:
    """Up to ``total`` units held at once, up to ``per_client`` of them by one client."""

    def __init__(self, total: int, per_client: int, unit: str) -> None:
        self.total, self.per_client, self.unit = total, per_client, unit
        self.held, self.by_client = 0, Counter()

    def take(self, client: str, amount: int = 1) -> str | None:
        """Hold ``amount`` more for ``client``; or, holding nothing, why not (for the log)."""
        if self.by_client[client] + amount > self.per_client:
            return f"{client} holds {self.by_client[client]} {self.unit} (at most {self.per_client})"
        if self.held + amount > self.total:
            return f"{self.held} {self.unit} held (at most {self.total})"
        self.held += amount
        self.by_client[client] += amount
        return None

    def give_back(self, client: str, amount: int = 1) -> None:
        self.held -= amount
        self.by_client[client] -= amount
        if not self.by_client[client]:
            del self.by_client[client]


class Members:
    """The public keys (the ``flwr-public-key`` header's value) of registered SuperNodes: those the
    SuperLink answered 200, at most :data:`KNOWN_KEYS`."""

    def __init__(self, known: int = KNOWN_KEYS, clock: Callable[[], datetime.datetime] = now) -> None:
        self.keys: OrderedDict[bytes, None] = OrderedDict()
        self.known, self.clock = known, clock

    def learn(self, headers: Mapping[bytes, bytes]) -> None:
        """The SuperLink answered 200 to a request with these headers: its key is a registered node's."""
        key = headers.get(_KEY)
        if key:
            self.keys[key] = None
            self.keys.move_to_end(key)
            while len(self.keys) > self.known:
                self.keys.popitem(last=False)

    def member(self, headers: Mapping[bytes, bytes]) -> bytes | None:
        """The key of the registered node that signed a request with these headers, or None."""
        key, signature, stamp = headers.get(_KEY), headers.get(_SIGNATURE), headers.get(_TIMESTAMP)
        if key not in self.keys or not signature or not stamp:
            return None
        try:
            age = (self.clock() - datetime.datetime.fromisoformat(stamp.decode("ascii"))).total_seconds()
            if not -SYSTEM_TIME_TOLERANCE < age < TIMESTAMP_TOLERANCE + SYSTEM_TIME_TOLERANCE:
                return None
            public = bytes_to_public_key(base64.b64decode(key, validate=True))
            return key if verify_signature(public, stamp, base64.b64decode(signature, validate=True)) else None
        except (ValueError, TypeError, UnicodeError, binascii.Error):
            return None


class Arrivals:
    """New connections per client: a token bucket of ``burst`` (times ``shared[client]``), refilled at
    ``rate`` a second (times the same), for at most :data:`KNOWN_ADDRESSES` clients."""

    def __init__(self, burst: int, rate: float = HANDSHAKES_PER_S, shared: Mapping[str, int] | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.burst, self.rate, self.shared, self.clock = burst, rate, dict(shared or {}), clock
        self.buckets: OrderedDict[str, tuple[float, float]] = OrderedDict()

    def admit(self, client: str) -> bool:
        """Whether a new connection from ``client`` may start its TLS handshake now."""
        now, times = self.clock(), self.shared.get(client, 1)
        tokens, since = self.buckets.pop(client, (self.burst * times, now))
        tokens = min(self.burst * times, tokens + (now - since) * self.rate * times)
        admitted = tokens >= 1
        self.buckets[client] = (tokens - admitted, now)
        if len(self.buckets) > KNOWN_ADDRESSES:
            self.buckets.popitem(last=False)
        return admitted


@dataclass(eq=False)
class Slot:
    """One connection's slot: the client it counts against, how to cut it off, whether a 200 has
    been answered on it (``proven``) and whether it still holds its slot (``held``)."""

    client: str
    cut: Callable[[], None]
    proven: bool = False
    held: bool = True


class Slots:
    """Connection slots (see the module docstring): ``total`` in all, ``per_client`` unproven ones
    per client, ``shared[client]`` times that for an address several SuperNodes share."""

    def __init__(self, total: int, per_client: int, shared: Mapping[str, int] | None = None) -> None:
        self.total, self.per_client, self.shared = total, per_client, dict(shared or {})
        self.held = 0
        self.unproven: dict[str, list[Slot]] = {}

    def limit(self, client: str) -> int:
        return min(self.total, self.per_client * self.shared.get(client, 1))

    def take(self, client: str, cut: Callable[[], None]) -> tuple[Slot | None, str]:
        """A slot for a new connection from ``client`` (``cut`` aborts it), another connection's cut off
        if need be; or None and why not (for the log)."""
        mine = len(self.unproven.get(client, ()))
        if mine >= self.limit(client):
            return None, f"{client} holds {mine} connections (at most {self.limit(client)})"
        if self.held >= self.total:
            victim = self._victim(mine)
            if victim is None:
                return None, f"{self.held} connections held (at most {self.total})"
            self.give_back(victim)
            victim.cut()
        slot = Slot(client, cut)
        self.held += 1
        self.unproven.setdefault(client, []).append(slot)
        return slot, ""

    def _victim(self, mine: int) -> Slot | None:
        """The oldest unproven connection of the address holding the most, if it holds more than
        ``mine`` + 1 (so that two addresses never take slots back and forth)."""
        most = max(self.unproven.values(), key=len, default=[])
        return most[0] if len(most) > mine + 1 else None

    def prove(self, slot: Slot) -> None:
        """A 200 was answered on ``slot``'s connection: a registered node's, no longer its address's."""
        if slot.held and not slot.proven:
            slot.proven = True
            self._forget(slot)

    def give_back(self, slot: Slot) -> None:
        if slot.held:
            slot.held = False
            self.held -= 1
            if not slot.proven:
                self._forget(slot)

    def _forget(self, slot: Slot) -> None:
        mine = self.unproven[slot.client]
        mine.remove(slot)
        if not mine:
            del self.unproven[slot.client]
