"""Pairwise-mask secure aggregation over any message phase (kCAGC Protocol 4).

Plain classes and functions, no Flower imports; the Flower layer carries the
bytes/arrays produced here in its messages and keeps a party's private state
(``SecAggParty.to_bytes()``) in ``context.state`` between phases.

Protocol (honest-but-curious server, all parties follow the protocol)
--------------------------------------------------------------------
1. **Advertise.**  Each client ``u`` runs ``SecAggParty.generate(u, session_id)``
   and uploads ``public_key_bytes()`` (a 32-byte X25519 public key).
   *Leaves the client:* the public key only.
2. **Relay/agree.**  The server checks and relays all public keys
   (:func:`relay_public_keys`); every client calls ``agree(peer_keys)``.  For
   every pair ``{u, v}`` both sides compute the X25519 shared secret and run
   HKDF-SHA256 over it with ``info`` binding the protocol label, the session id
   and both party ids, giving a 32-byte mask seed ``s_uv`` and a 32-byte
   channel key ``k_uv`` (the latter only used by the dropout-recovery variant).
   The server never learns ``s_uv`` (it only sees public keys).
3. **Masked upload.**  For a tag (round, tensor, ...) client ``u`` fixed-point
   encodes its float array into the ring Z_2^w, w = 32 or 64
   (:class:`FixedPointEncoder`), and adds,
   for every peer ``v``, ``+PRG(s_uv, tag)`` if ``u < v`` and ``-PRG(s_uv, tag)``
   if ``u > v``.  ``PRG`` is the ChaCha20 keystream (``cryptography``) under the
   key ``BLAKE2b(key=s_uv, tag)``, so every (pair, tag) gets a fresh
   independent mask; a party refuses to mask twice under the same tag.
   *Leaves the client:* one uint32 / uint64 array of the input's shape,
   uniformly distributed in Z_2^w for anyone not holding the pair seeds.
4. **Unmask.**  The server adds the masked arrays modulo 2^w
   (:func:`unmask_sum`); every pairwise mask appears once with ``+`` and once
   with ``-`` and cancels exactly.  *The server learns:* the sum of the inputs
   (to the fixed-point resolution ``1/scale``) and nothing else about any
   single input (against a server not colluding with clients).

Overflow and ring size: the encoder refuses any value with ``|x| > bound``
and uses the smaller ring Z_2^32 when ``num_parties * round(bound * scale) <
2^31``, else Z_2^64 (refusing to be built unless that product is < 2^63), so
the true sum never wraps in the signed interpretation of the ring. The ring
follows from the encoder parameters alone, so every party and the server agree
on it; a protocol that can prove a small bound (e.g. squared distances of unit
vectors) halves the bytes of every masked upload at the same resolution.

Dropouts
--------
The simple protocol (:func:`unmask_sum`) cannot remove the masks of a missing
party: it raises :class:`SecAggDropoutError` naming the missing ids. The
recovery variant (double masking: a self mask per tag, Shamir-shared among the
parties, and one more round) lets a sum go on with the survivors:
:mod:`fedgraphcore.privacy.secagg_recovery`.

Wiring into Flower messages (``fedgraphcore.session.ServerSession.setup_secure_aggregation``)
-------------------------------------------------------------------------------------
Key generation: client ``generate`` -> its public key in the hello reply (or a
``query.secagg_setup`` reply); state ``context.state["secagg"]``.
Agreement: the server relays ``pack_id_bytes(relay_public_keys(...))`` (str keys) with
the first step after the handshake (or in ``query.secagg_agree``); client
``agree(unpack_id_bytes(...))``, stores state.
Any later phase: client ``mask(values, tag, encoder)`` -> ArrayRecord (``encoder.dtype``)
(store state again: used tags); server ``unmask_sum``.  Recovery variant:
:meth:`fedgraphcore.session.ServerSession.secure_sum` (``secagg_unmask``).  All parties and the server must
use the same encoder parameters (``FixedPointEncoder.params()``).

Pairwise seeds are session-long; a party that dropped out of a tag can rejoin
later tags (its pairwise masks of the dropped tag were revealed, but the
masks of other tags are independent PRG outputs).
"""

from __future__ import annotations

import hashlib
import json
import os
from base64 import b64decode, b64encode
from typing import Iterable, Mapping

import numpy as np
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms
from cryptography.hazmat.primitives.ciphers.aead import ChaCha20Poly1305
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from cryptography.hazmat.primitives.serialization import Encoding, NoEncryption, PrivateFormat, PublicFormat

from fedgraphcore.errors import FedGraphError

__all__ = [
    "SecAggError",
    "SecAggDropoutError",
    "SecAggOverflowError",
    "FixedPointEncoder",
    "SecAggParty",
    "relay_public_keys",
    "unmask_sum",
    "sum_masked",
    "prg",
    "pack_id_bytes",
    "unpack_id_bytes",
]

_PROTO = b"fedgraphcore.privacy.secagg/v1"


class SecAggError(FedGraphError, RuntimeError):
    """Protocol violation (bad keys, shapes, reused tag, inconsistent sets)."""


class SecAggDropoutError(SecAggError):
    """An expected party's upload is missing; the simple protocol must abort."""

    def __init__(self, missing: Iterable[int], detail: str = ""):
        self.missing = sorted(int(m) for m in missing)
        msg = f"secure aggregation aborted: missing upload from party id(s) {self.missing}"
        if detail:
            msg += f" ({detail})"
        super().__init__(msg)


class SecAggOverflowError(FedGraphError, ValueError):
    """A value exceeds the encoder's declared bound (the sum could wrap)."""


# --------------------------------------------------------------------------- encoding
class FixedPointEncoder:
    """Fixed-point encoding of floats into the ring Z_2^w with an overflow guard.

    ``q = round(x * scale)`` stored as a w-bit two's complement unsigned
    integer (``dtype`` uint32 or uint64).  ``ring_bits`` w is 32 when
    ``num_parties * round(bound*scale) < 2^31``, else 64.  The declared
    ``bound`` is checked on every ``encode`` so that a sum of ``num_parties``
    encoded values satisfies ``|sum| <= num_parties * round(bound*scale) <
    2^(w-1)`` and decodes exactly (no wrap).  Resolution is ``1/scale`` per
    value; the decoded sum has an absolute error of at most
    ``num_parties / (2*scale)``, whichever the ring.
    """

    RINGS = (32, 64)

    def __init__(self, scale: float, bound: float, num_parties: int):
        scale = float(scale)
        bound = float(bound)
        if int(num_parties) != num_parties:
            raise ValueError(f"FixedPointEncoder: num_parties must be a whole number, got {num_parties}")
        num_parties = int(num_parties)
        if not (np.isfinite(scale) and scale > 0):
            raise ValueError(f"FixedPointEncoder: scale must be finite and > 0, got {scale}")
        if not (np.isfinite(bound) and bound > 0):
            raise ValueError(f"FixedPointEncoder: bound must be finite and > 0, got {bound}")
        if num_parties < 1:
            raise ValueError(f"FixedPointEncoder: num_parties must be >= 1, got {num_parties}")
        self.scale = scale
        self.bound = bound
        self.num_parties = num_parties
        self.max_q = int(round(bound * scale))
        fits = [w for w in self.RINGS if num_parties * self.max_q < 2 ** (w - 1) and bound * scale < 2.0 ** (w - 1)]
        if not fits:
            raise SecAggOverflowError(
                f"FixedPointEncoder: num_parties*bound*scale = {num_parties}*{bound}*{scale} "
                f"= {num_parties * bound * scale:.4g} does not fit in the signed range of Z_2^64 (< 2^63)"
            )
        self.ring_bits = fits[0]
        self.dtype = np.dtype(f"uint{self.ring_bits}")
        self._signed = np.dtype(f"int{self.ring_bits}")

    def encode(self, values) -> np.ndarray:
        """float array -> ``dtype`` array (same shape). Raises on |x| > bound or non-finite."""
        x = np.asarray(values, dtype=np.float64)
        if x.size:
            if not np.all(np.isfinite(x)):
                raise SecAggOverflowError("FixedPointEncoder.encode: non-finite value (nan/inf) in input")
            if float(np.max(np.abs(x))) > self.bound:
                # the text goes back to the server, which chose the bound: naming the value
                # would leak the largest entry of the private array in clear
                raise SecAggOverflowError(
                    f"FixedPointEncoder.encode: a value exceeds the declared bound {self.bound:.6g} in absolute "
                    "value; valid: |value| <= bound (raise secagg.bound)"
                )
        q = np.rint(x * self.scale).astype(self._signed)  # |q| <= max_q fits the ring's signed range
        return q.view(self.dtype)

    def decode(self, ring_sum) -> np.ndarray:
        """Sum of encodings (``dtype``, mod 2^w) -> float64, two's-complement interpretation."""
        s = np.asarray(ring_sum)
        if s.dtype != self.dtype:
            raise SecAggError(f"FixedPointEncoder.decode: expected {self.dtype}, got {s.dtype}")
        return s.view(self._signed).astype(np.float64) / self.scale

    def params(self) -> dict:
        return {"scale": self.scale, "bound": self.bound, "num_parties": self.num_parties}


def finest_scale(bound: float, num_parties: int, ring_bits: int) -> float:
    """The largest power-of-two ``scale`` (finest resolution ``1/scale``) with
    which :class:`FixedPointEncoder` ``(scale, bound, num_parties)`` still fits
    the ring Z_2^``ring_bits``: finer would need the next ring up (or none)."""
    if ring_bits not in FixedPointEncoder.RINGS:
        raise ValueError(f"finest_scale: ring_bits must be one of {FixedPointEncoder.RINGS}, got {ring_bits}")
    if not (np.isfinite(bound) and bound > 0) or int(num_parties) < 1:
        raise ValueError(f"finest_scale: needs a finite bound > 0 and num_parties >= 1, got {bound}, {num_parties}")
    limit = 2 ** (ring_bits - 1)
    # in logs: limit / (n * bound) overflows for a tiny bound; 2^1023 is float64's largest power of two
    exponent = min(1023, int(np.floor((ring_bits - 1) - np.log2(int(num_parties)) - np.log2(float(bound)))))
    # round(bound * scale) may round up past the limit: step down until the encoder's own test passes
    while not (int(num_parties) * int(round(bound * 2.0 ** exponent)) < limit and bound * 2.0 ** exponent < limit):
        exponent -= 1
    return 2.0 ** exponent


# --------------------------------------------------------------------------- PRG
_ZEROS = bytearray(0)


def _zeros(nbytes: int) -> memoryview:
    global _ZEROS
    if len(_ZEROS) < nbytes:
        _ZEROS = bytearray(max(nbytes, 2 * len(_ZEROS)))
    return memoryview(_ZEROS)[:nbytes]


def _tag_bytes(tag) -> bytes:
    return tag if isinstance(tag, bytes) else str(tag).encode("utf-8")


def _prg_into(seed: bytes, tag: bytes, buf: bytearray, n: int, dtype: np.dtype) -> np.ndarray:
    """Fill ``buf`` with n ring elements (``dtype``) of ChaCha20 keystream under key BLAKE2b(seed, tag)."""
    key = hashlib.blake2b(tag, key=seed, digest_size=32, person=b"secagg-prg-v1").digest()
    enc = Cipher(algorithms.ChaCha20(key, bytes(16)), mode=None).encryptor()
    enc.update_into(_zeros(dtype.itemsize * n), buf)
    return np.frombuffer(buf, dtype=dtype, count=n)


def prg(seed: bytes, tag, n: int, dtype=np.uint64) -> np.ndarray:
    """n pseudo-random ring elements (uint32 / uint64) from a 32-byte seed and a tag (ChaCha20 keystream)."""
    dtype = np.dtype(dtype)
    buf = bytearray(dtype.itemsize * n + 64)
    return _prg_into(bytes(seed), _tag_bytes(tag), buf, n, dtype).copy()


# --------------------------------------------------------------------------- party
def _hkdf_pair(shared: bytes, session: bytes, a: int, b: int) -> tuple[bytes, bytes]:
    lo, hi = (a, b) if a < b else (b, a)
    info = _PROTO + b"|session=" + session + f"|pair={lo},{hi}".encode()
    okm = HKDF(algorithm=hashes.SHA256(), length=64, salt=None, info=info).derive(shared)
    return okm[:32], okm[32:]


class SecAggParty:
    """Client-side secure-aggregation state for one party.

    Private state: the X25519 private key, derived pair seeds/channel keys, the
    set of tags already used and its recoverable uploads (:attr:`recovery`).  Serialise
    with :meth:`to_bytes` / :meth:`from_bytes` (or :meth:`to_array` /
    :meth:`from_array` for an ``ArrayRecord``) to keep it in Flower's
    ``context.state`` between phases; it never leaves the client.
    """

    def __init__(self, party_id: int, private_key: X25519PrivateKey, session_id: bytes | str = b""):
        self.party_id = int(party_id)
        if self.party_id < 0:
            raise ValueError("SecAggParty: party_id must be a non-negative integer")
        self._sk = private_key
        self.session_id = _tag_bytes(session_id)
        self._seeds: dict[int, bytes] = {}  # peer -> 32-byte mask seed
        self._chan: dict[int, bytes] = {}  # peer -> 32-byte channel key
        self._used_tags: set[str] = set()
        #: tag -> the party's recoverable upload of it: own self-mask share, participants, threshold
        #: and the [survivors, dropped] split it answered (fedgraphcore.privacy.secagg_recovery)
        self.recovery: dict[str, dict] = {}

    # --- keys
    @classmethod
    def generate(cls, party_id: int, session_id: bytes | str = b"") -> "SecAggParty":
        """Fresh X25519 key pair for ``party_id`` (bound to ``session_id`` in HKDF)."""
        return cls(party_id, X25519PrivateKey.generate(), session_id)

    def public_key_bytes(self) -> bytes:
        """32-byte raw X25519 public key (the only thing sent in the advertise phase)."""
        return self._sk.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)

    @property
    def peers(self) -> list[int]:
        return sorted(self._seeds)

    def agree(self, peer_public_keys: Mapping[int, bytes]) -> None:
        """Derive pair seeds with every peer (X25519 + HKDF-SHA256).

        ``peer_public_keys`` maps party id -> 32-byte public key for all parties
        of the aggregation; the own entry, if present, must equal our key.
        """
        own = self.public_key_bytes()
        seen = {}
        seeds, chans = {}, {}
        for pid, pk in peer_public_keys.items():
            pid = int(pid)
            pk = bytes(pk)
            if len(pk) != 32:
                raise SecAggError(f"party {pid}: public key must be 32 bytes, got {len(pk)}")
            if pk in seen and seen[pk] != pid:
                raise SecAggError(f"parties {seen[pk]} and {pid} advertised the same public key")
            seen[pk] = pid
            if pid == self.party_id:
                if pk != own:
                    raise SecAggError(f"relayed public key of own id {pid} does not match this party's key")
                continue
            if pk == own:
                raise SecAggError(f"party {pid} advertised this party's public key")
            try:
                shared = self._sk.exchange(X25519PublicKey.from_public_bytes(pk))
            except ValueError as e:  # low-order point etc.
                raise SecAggError(f"X25519 exchange with party {pid} failed: {e}") from None
            seeds[pid], chans[pid] = _hkdf_pair(shared, self.session_id, self.party_id, pid)
        if not seeds:
            raise SecAggError("secure aggregation needs at least 2 parties")
        self._seeds, self._chan = seeds, chans

    # --- masking
    def _check_ready(self, tag: str, encoder: FixedPointEncoder, n_parties: int | None = None) -> None:
        if not self._seeds:
            raise SecAggError("SecAggParty: call agree() before mask()")
        if tag in self._used_tags:
            raise SecAggError(f"party {self.party_id}: tag {tag!r} already used (masks must never be reused)")
        n_parties = len(self._seeds) + 1 if n_parties is None else n_parties
        if encoder.num_parties < n_parties:
            raise SecAggOverflowError(
                f"encoder declared num_parties={encoder.num_parties} < {n_parties} parties in the aggregation"
            )

    def _pairwise(self, acc: np.ndarray, tagb: bytes, peers: Iterable[int], sign: int = 1) -> np.ndarray:
        n = acc.size
        buf = bytearray(acc.dtype.itemsize * n + 64)
        for v in peers:
            m = _prg_into(self._seeds[v], tagb, buf, n, acc.dtype)
            if (self.party_id < v) == (sign > 0):
                np.add(acc, m, out=acc)
            else:
                np.subtract(acc, m, out=acc)
        return acc

    def mask(
        self, values, tag: str, encoder: FixedPointEncoder, participants: Iterable[int] | None = None
    ) -> np.ndarray:
        """Encode ``values`` and add all pairwise masks for ``tag``; returns ``encoder.dtype`` (same shape).

        Output is what the client uploads; alone it is uniform in the ring.
        ``participants`` (optional): the ids taking part in this aggregation
        (this party and a subset of its agreed peers, announced by the server,
        e.g. the clients sampled for a round); default: all agreed parties.
        The server must then call :func:`unmask_sum` with the same set.
        """
        tag = str(tag)
        peers = self.peers
        if participants is not None:
            part = set(int(p) for p in participants)
            if self.party_id not in part:
                raise SecAggError(f"party {self.party_id} is not among the participants")
            unknown = part - set(peers) - {self.party_id}
            if unknown:
                raise SecAggError(f"participants {sorted(unknown)} have no agreed key with party {self.party_id}")
            if len(part) < 2:
                raise SecAggError("secure aggregation needs at least 2 participants")
            peers = sorted(part - {self.party_id})
        self._check_ready(tag, encoder, len(peers) + 1)
        q = encoder.encode(values)
        shape = q.shape
        acc = np.ascontiguousarray(q).reshape(-1).copy()
        self._pairwise(acc, (tag).encode(), peers)
        self._used_tags.add(tag)
        return acc.reshape(shape)

    # --- sealed messages between two parties, and the party's own pads
    def seal(self, peer: int, payload: bytes, label: str) -> bytes:
        """``payload`` encrypted for ``peer`` alone (ChaCha20-Poly1305 under the pair's channel
        key; ``label`` binds it to one use): nonce + ciphertext, for the server to relay."""
        nonce = os.urandom(12)
        return nonce + ChaCha20Poly1305(self._chan[int(peer)]).encrypt(nonce, bytes(payload),
                                                                       self._aad(label, self.party_id, int(peer)))

    def unseal(self, peer: int, sealed: bytes, label: str) -> bytes:
        """The payload ``peer`` sealed for this party under ``label``; SecAggError if it fails
        authentication (altered in transit, or sealed for another party or use)."""
        sealed = bytes(sealed)
        try:
            return ChaCha20Poly1305(self._chan[int(peer)]).decrypt(sealed[:12], sealed[12:],
                                                                   self._aad(label, int(peer), self.party_id))
        except (InvalidTag, KeyError):
            raise SecAggError(f"a sealed message from party {peer} failed authentication") from None

    def pad(self, tag: str, n: int, dtype) -> np.ndarray:
        """This party's one-time pad for ``tag``: ``n`` uniform ring elements from a seed only it
        holds (derived from its private key), so it can remove the pad later without keeping it."""
        sk = self._sk.private_bytes(Encoding.Raw, PrivateFormat.Raw, NoEncryption())
        seed = HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=_PROTO + b"|pad").derive(sk)
        return prg(seed, b"pad|" + _tag_bytes(tag), int(n), dtype)

    # --- recovery variant (double masking, fedgraphcore.privacy.secagg_recovery)
    def _aad(self, tag: str, sender: int, receiver: int) -> bytes:
        return _PROTO + b"|share|session=" + self.session_id + f"|tag={tag}|from={sender}|to={receiver}".encode()

    def pair_masks(self, acc: np.ndarray, tag: str, peers: Iterable[int]) -> np.ndarray:
        """Add to ``acc`` (a ring array, in place) this party's signed pair masks of ``tag`` with
        ``peers``: what its masked upload of ``tag`` holds of them."""
        return self._pairwise(acc, str(tag).encode(), peers)

    # --- state (de)serialisation
    def to_bytes(self) -> bytes:
        """Private state as bytes (keep in ``context.state``; never upload)."""
        sk = self._sk.private_bytes(Encoding.Raw, PrivateFormat.Raw, NoEncryption())
        d = {
            "v": 1,
            "id": self.party_id,
            "session": b64encode(self.session_id).decode(),
            "sk": b64encode(sk).decode(),
            "seeds": {str(k): b64encode(v).decode() for k, v in self._seeds.items()},
            "chan": {str(k): b64encode(v).decode() for k, v in self._chan.items()},
            "used": sorted(self._used_tags),
            "recovery": {tag: {**held, "share": str(held["share"])} for tag, held in self.recovery.items()},
        }
        return json.dumps(d, separators=(",", ":")).encode()

    @classmethod
    def from_bytes(cls, data: bytes) -> "SecAggParty":
        d = json.loads(bytes(data).decode())
        if d.get("v") != 1:
            raise SecAggError("SecAggParty.from_bytes: unknown state version")
        p = cls(d["id"], X25519PrivateKey.from_private_bytes(b64decode(d["sk"])), b64decode(d["session"]))
        p._seeds = {int(k): b64decode(v) for k, v in d["seeds"].items()}
        p._chan = {int(k): b64decode(v) for k, v in d["chan"].items()}
        p._used_tags = set(d["used"])
        p.recovery = {tag: {**held, "share": int(held["share"])} for tag, held in d["recovery"].items()}
        return p

    def to_array(self) -> np.ndarray:
        """Private state as a uint8 numpy array (for an ArrayRecord)."""
        return np.frombuffer(self.to_bytes(), dtype=np.uint8).copy()

    @classmethod
    def from_array(cls, arr) -> "SecAggParty":
        return cls.from_bytes(np.asarray(arr, dtype=np.uint8).tobytes())


# --------------------------------------------------------------------------- transport helpers
def pack_id_bytes(d: Mapping[int, bytes]) -> dict[str, bytes]:
    """{party id: bytes} -> {str id: bytes} (Flower ConfigRecord keys must be str)."""
    return {str(int(k)): bytes(v) for k, v in d.items()}


def unpack_id_bytes(d: Mapping[str, bytes]) -> dict[int, bytes]:
    """Inverse of :func:`pack_id_bytes`."""
    return {int(k): bytes(v) for k, v in d.items()}


# --------------------------------------------------------------------------- server
def relay_public_keys(uploads: Mapping[int, bytes], expected_parties: Iterable[int] | None = None) -> dict[int, bytes]:
    """Server: validate advertised keys (32 bytes, distinct, none missing) and return the relay map."""
    bad = sorted(int(k) for k, v in uploads.items() if not isinstance(v, (bytes, bytearray, memoryview)))
    if bad:
        raise SecAggError(f"party {bad[0]}: public key must be 32 bytes, got {type(uploads[bad[0]]).__name__}")
    out = {int(k): bytes(v) for k, v in uploads.items()}
    if expected_parties is not None:
        missing = set(int(e) for e in expected_parties) - set(out)
        if missing:
            raise SecAggDropoutError(missing, "no public key advertised")
    for k, v in out.items():
        if len(v) != 32:
            raise SecAggError(f"party {k}: public key must be 32 bytes, got {len(v)}")
    if len(set(out.values())) != len(out):
        raise SecAggError("two parties advertised the same public key")
    if len(out) < 2:
        raise SecAggError("secure aggregation needs at least 2 parties")
    return out


def check_uploads(masked_uploads: Mapping[int, np.ndarray], dtype: np.dtype) -> tuple[tuple, list]:
    shape = None
    arrs = []
    for pid in sorted(masked_uploads):
        a = np.asarray(masked_uploads[pid])
        if a.dtype != dtype:
            raise SecAggError(f"party {pid}: masked upload must be {dtype} (the encoder's ring), got {a.dtype}")
        if shape is None:
            shape = a.shape
        elif a.shape != shape:
            raise SecAggError(f"party {pid}: masked upload shape {a.shape} differs from {shape}")
        arrs.append(a)
    return shape, arrs


def sum_masked(arrays: list[np.ndarray]) -> np.ndarray:
    """Sum ring arrays (all uint32 or all uint64) modulo 2^w (numpy wraps unsigned integers)."""
    acc = np.array(arrays[0], copy=True)
    for a in arrays[1:]:
        np.add(acc, a, out=acc)
    return acc


def decode_honest_sum(encoder: FixedPointEncoder, ring_sum: np.ndarray, parties: int) -> np.ndarray:
    """Decode a sum over ``parties`` uploads, each encoded within +-round(bound x scale):
    an honest sum lies within ``parties`` times that. Outside it, some upload was not
    this step's encoding plus masks (a value beyond the bound, another tag, seed or
    encoder, or a wrong share reconstruction), and the decoded value is meaningless."""
    if parties > encoder.num_parties:
        raise SecAggOverflowError(f"a sum over {parties} parties with an encoder declared for num_parties="
                                  f"{encoder.num_parties}: its ring is only guaranteed not to wrap for that many")
    total = encoder.decode(ring_sum)
    most = parties * encoder.max_q / encoder.scale
    if total.size and float(np.max(np.abs(total))) > most:
        raise SecAggError(f"the unmasked sum over {parties} parties reaches {float(np.max(np.abs(total))):.6g}, "
                          f"beyond {parties} x the declared bound {encoder.bound:.6g}: an upload is not an honest "
                          "encoding masked for this step, or a self-mask seed was rebuilt from wrong shares")
    return total


def unmask_sum(
    masked_uploads: Mapping[int, np.ndarray], expected_parties: Iterable[int], encoder: FixedPointEncoder
) -> np.ndarray:
    """Server: sum the masked uploads in the encoder's ring and decode to float64.

    Raises :class:`SecAggDropoutError` if any expected party is missing (the
    masks of a missing party cannot be removed in the simple protocol), and
    :class:`SecAggError` on unexpected parties, dtype or shape mismatch, or a
    sum beyond the parties' declared bound (masks that did not cancel).
    """
    expected = set(int(e) for e in expected_parties)
    got = set(int(k) for k in masked_uploads)
    missing = expected - got
    if missing:
        raise SecAggDropoutError(missing)
    extra = got - expected
    if extra:
        raise SecAggError(f"uploads from unexpected party id(s) {sorted(extra)}")
    if not got:
        raise SecAggError("no uploads")
    _, arrs = check_uploads({int(k): v for k, v in masked_uploads.items()}, encoder.dtype)
    return decode_honest_sum(encoder, sum_masked(arrs), len(expected))

