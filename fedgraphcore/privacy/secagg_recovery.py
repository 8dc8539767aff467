"""Secure sums that survive dropouts: double masking (Bonawitz et al. 2017).

Plain functions, no Flower imports; :mod:`fedgraphcore.privacy.secagg` holds the pairwise
masks, the fixed-point ring and :class:`~fedgraphcore.privacy.secagg.SecAggParty`, whose
``mask_recoverable`` / ``unmask_response`` call the party-side functions here;
:meth:`fedgraphcore.session.ServerSession.secure_sum` carries the bytes.

Protocol for one sum (tag ``T``) among the ``participants`` P, threshold ``t``
-----------------------------------------------------------------------------
1. **Masked upload** (the strategy's own step; :func:`mask_recoverable`).  Party
   ``u`` uploads ``encode(x_u) + sum_v +-PRG(s_uv, T) + PRG(b_u, T)``: the
   pairwise masks of :meth:`SecAggParty.mask` plus a *self mask* from a fresh
   per-tag seed ``b_u`` (uniform in GF(2^255-19)), and Shamir shares
   (threshold ``t``) of ``b_u``, one per peer, each sealed for that peer alone
   (:meth:`SecAggParty.seal`, ChaCha20-Poly1305 under the pair's channel key,
   bound to the tag and both ids).  *Leaves the client:* the masked array
   (uniform in the ring) and ``|P| - 1`` sealed 60-byte shares.
2. **Unmask** (one more round, ``secagg_unmask``; :func:`unmask_response`).  The
   server names the survivors S (whose upload arrived) and the dropped D =
   P - S and hands each survivor the sealed shares addressed to it.  Each
   survivor answers with its shares of the survivors' self-mask seeds and, for
   the dropped parties, its own signed pair masks with them for ``T`` (a
   correction vector; empty when nobody dropped).  *Leaves the client:* |S|
   32-byte shares and the correction.
3. **Sum** (:func:`recover_sum`).  The server rebuilds each survivor's ``b_u``
   from ``t`` shares, removes the self masks and the corrections: the
   survivors' sum.

What the server learns: the sum over the survivors, which parties dropped,
each survivor's self-mask seed of this tag (one-time) and the pair masks of
this tag between survivors and dropped parties, neither of which tells it
anything about an input: a dropped party's upload arriving late stays hidden
by its self mask, whose shares nobody gives for a party named dropped.

Rules a party keeps (a refusal is a :class:`SecAggError`):

* one (survivors, dropped) split per tag: it never gives both a share of a
  party's self mask and its pair masks with that party for the same tag, and
  refuses a request that names a party dropped after it gave a share of its
  self mask (or a survivor after it gave its pair masks);
* ``t`` is a majority of P (:func:`check_threshold`): below it, a few
  parties colluding with the server rebuild an honest party's self mask; the
  survivors must number at least ``t``, so a sum is never over one party.

Why the dropped parties' masks come from the survivors and not from shares of
their keys: the pair seeds are session-long, and a survivor's self-mask seed is
revealed at every sum. Rebuilding a dropped party's X25519 key would unmask
every earlier sum of that party (its self-mask seeds of those tags are
already known); the correction of one tag reveals that tag's masks only. The
cost: after a dropout every survivor must answer the unmask round (without
one, any ``t`` answers suffice).  A server that tells parties different splits
meets the per-tag rule above and, between members with identity keys, SecAgg's
signed consistency round (:mod:`fedgraphcore.privacy.roster`): every survivor signs the
split it was told (:func:`told_split` first), and a member answers the unmask
round only once every survivor's signature names the split it was told.
"""

from __future__ import annotations

import secrets
from typing import TYPE_CHECKING, Iterable, Mapping

import numpy as np

from fedgraphcore.privacy.secagg import (
    FixedPointEncoder,
    SecAggDropoutError,
    SecAggError,
    check_uploads,
    decode_honest_sum,
    prg,
    sum_masked,
)

if TYPE_CHECKING:
    from fedgraphcore.privacy.secagg import SecAggParty

SHAMIR_PRIME = 2**255 - 19  # prime field for Shamir shares of 32-byte seeds
SHARE_BYTES = 32
SEALED_SHARE_BYTES = 12 + SHARE_BYTES + 16  # nonce, share, Poly1305 tag


class RecoveryRefused(SecAggError):
    """An unmask request a party must not answer (a decision, not a fault): another split of a
    tag it answered, or one below the threshold or beside the tag's parties."""


# --------------------------------------------------------------------------- Shamir
def shamir_split(secret: int, xs: list[int], threshold: int) -> dict[int, int]:
    """Shamir shares of ``secret`` in GF(SHAMIR_PRIME) at the points ``xs`` (nonzero)."""
    p = SHAMIR_PRIME
    if not (1 <= threshold <= len(xs)):
        raise ValueError(f"shamir_split: need 1 <= threshold <= {len(xs)}, got {threshold}")
    coeffs = [secret % p] + [secrets.randbelow(p) for _ in range(threshold - 1)]
    out = {}
    for x in xs:
        if x % p == 0:
            raise ValueError("shamir_split: evaluation point must be nonzero")
        acc = 0
        for c in reversed(coeffs):
            acc = (acc * x + c) % p
        out[x] = acc
    return out


def shamir_reconstruct(shares: Mapping[int, int]) -> int:
    """Lagrange interpolation at 0 from {x: y} (needs at least ``threshold`` shares)."""
    p = SHAMIR_PRIME
    xs = list(shares)
    total = 0
    for i, xi in enumerate(xs):
        num, den = 1, 1
        for j, xj in enumerate(xs):
            if i != j:
                num = (num * (-xj)) % p
                den = (den * (xi - xj)) % p
        total = (total + shares[xi] * num * pow(den, -1, p)) % p
    return total


def share_x(party_id: int) -> int:
    """The Shamir evaluation point of a party (its id + 1: never 0, the secret's point)."""
    return int(party_id) + 1


# --------------------------------------------------------------------------- threshold
def recovery_threshold(parties: int) -> int:
    """The default threshold for a sum among ``parties``: a strict majority."""
    return int(parties) // 2 + 1


def check_threshold(threshold: int, parties: int) -> None:
    """Refuse a threshold that makes the self masks meaningless (below a majority of the
    ``parties``: a minority colluding with the server rebuilds any self mask) or that no set of
    shares reaches (above ``parties``)."""
    low = max(2, recovery_threshold(parties))
    if int(threshold) != threshold or not low <= int(threshold) <= parties:
        raise SecAggError(f"threshold={threshold} for a sum among {parties} parties; valid: {low}..{parties} "
                          "(a majority: fewer shares would let a minority rebuild a self mask)")


def self_mask(seed: int, tag: str, n: int, dtype) -> np.ndarray:
    """A party's self mask of ``tag``: ``n`` ring elements from its per-tag seed."""
    return prg(int(seed).to_bytes(SHARE_BYTES, "little"), b"self|" + str(tag).encode(), n, dtype)


def _share_label(tag: str) -> str:
    return f"self-mask|{tag}"


# --------------------------------------------------------------------------- party side
def mask_recoverable(party: SecAggParty, values, tag: str, encoder: FixedPointEncoder, threshold: int,
                     participants: Iterable[int] | None = None) -> tuple[np.ndarray, dict[int, bytes]]:
    """Party side of step 1: ``(masked, sealed)``, ``masked`` the upload (``encoder.dtype``),
    ``sealed[v]`` this party's Shamir share of its fresh self-mask seed for ``tag``, sealed for
    party ``v`` alone. ``participants``: the parties of the sum (default: every agreed party).
    The own share, the participants and the threshold stay in ``party.recovery[tag]``."""
    tag = str(tag)
    group = sorted({int(p) for p in participants} if participants is not None
                   else set(party.peers) | {party.party_id})
    check_threshold(threshold, len(group))
    masked = party.mask(values, tag, encoder, participants=None if participants is None else group)
    flat = masked.reshape(-1)
    seed = secrets.randbelow(SHAMIR_PRIME)
    np.add(flat, self_mask(seed, tag, flat.size, flat.dtype), out=flat)
    shares = shamir_split(seed, [share_x(i) for i in group], int(threshold))
    sealed = {v: party.seal(v, shares[share_x(v)].to_bytes(SHARE_BYTES, "little"), _share_label(tag))
              for v in group if v != party.party_id}
    party.recovery[tag] = {"share": shares[share_x(party.party_id)], "participants": group,
                           "threshold": int(threshold)}
    return flat.reshape(masked.shape), sealed


def unmask_response(party: SecAggParty, tag: str, survivors: Iterable[int], dropped: Iterable[int],
                    sealed: Mapping[int, bytes], size: int,
                    encoder: FixedPointEncoder) -> tuple[dict[int, bytes], np.ndarray]:
    """Party side of step 2: ``(shares, correction)``, ``shares[u]`` this party's 32-byte share
    of survivor ``u``'s self-mask seed (its own included; ``sealed[u]`` is what ``u`` sealed for
    it), ``correction`` its signed pair masks with the ``dropped`` parties (length ``size``).
    Refuses (:class:`SecAggError`) a split other than one it answered before for ``tag``."""
    tag = str(tag)
    split = told_split(party, tag, survivors, dropped)
    held = party.recovery[tag]
    out = {party.party_id: int(held["share"]).to_bytes(SHARE_BYTES, "little")}
    for u in split[0]:
        if u == party.party_id:
            continue
        if sealed.get(u) is None:
            raise SecAggError(f"missing share ciphertext from survivor {u}")
        try:
            out[u] = party.unseal(u, bytes(sealed[u]), _share_label(tag))
        except SecAggError:
            raise SecAggError(f"share ciphertext from party {u} failed authentication") from None
    correction = np.zeros(int(size), dtype=encoder.dtype)
    party.pair_masks(correction, tag, split[1])
    held["split"] = split
    return out, correction


def told_split(party: SecAggParty, tag: str, survivors: Iterable[int], dropped: Iterable[int]) -> list[list[int]]:
    """[survivors, dropped] of a request for ``tag`` this party may answer (:class:`RecoveryRefused`
    otherwise): they split the tag's parties, name it a survivor, reach the threshold and agree
    with any split it answered before for the tag."""
    held = party.recovery.get(str(tag))
    if held is None:
        raise SecAggError(f"party {party.party_id} made no recoverable upload under tag {str(tag)!r}")
    return _checked_split(party.party_id, str(tag), held, survivors, dropped)


def _checked_split(me: int, tag: str, held: dict, survivors, dropped) -> list[list[int]]:
    """[survivors, dropped] sorted, once they split the tag's participants, name this party a
    survivor, reach the threshold and agree with any split answered before for the tag."""
    surv, drop = sorted({int(s) for s in survivors}), sorted({int(d) for d in dropped})
    if me not in surv:
        raise RecoveryRefused(f"party {me} is not listed among the survivors")
    if set(surv) & set(drop):
        raise RecoveryRefused("survivor and dropped sets overlap")
    if set(surv) | set(drop) != set(held["participants"]):
        raise RecoveryRefused(f"survivors + dropped must be exactly the parties of the sum {held['participants']}")
    if len(surv) < held["threshold"]:
        raise RecoveryRefused(f"{len(surv)} survivors of tag {tag!r}, below the threshold {held['threshold']}: "
                          "their sum would be too few parties' inputs")
    before = held.get("split")
    if before is not None and before != [surv, drop]:
        was_survivor = sorted(set(before[0]) & set(drop))
        party = (was_survivor or sorted(set(before[1]) & set(surv)))[0]
        given, asked = (("a share of its self mask", "its pair masks") if was_survivor
                        else ("its pair masks", "a share of its self mask"))
        raise RecoveryRefused(f"party {me}: tag {tag!r} was already unmasked with a different dropout set; it gave "
                          f"{given} for party {party} and refuses {asked} (never both for one party)")
    return [surv, drop]


# --------------------------------------------------------------------------- wire form
def sealed_rows(sealed: Mapping[int, bytes], parties: int) -> np.ndarray:
    """``{party: sealed share}`` as a uint8 array (``parties`` x 60), row ``v`` for party ``v``
    (zeros where none: the sender's own row and parties outside the sum)."""
    rows = np.zeros((int(parties), SEALED_SHARE_BYTES), dtype=np.uint8)
    for v, ct in sealed.items():
        if len(ct) != SEALED_SHARE_BYTES or not 0 <= int(v) < parties:
            raise SecAggError(f"sealed share for party {v}: {len(ct)} bytes, valid: {SEALED_SHARE_BYTES} bytes "
                              f"for a party 0..{parties - 1}")
        rows[int(v)] = np.frombuffer(ct, dtype=np.uint8)
    return rows


def inbox(rows_by_party: Mapping[int, np.ndarray], receiver: int, survivors: Iterable[int]) -> np.ndarray:
    """Server: what ``receiver`` gets in the unmask request, a uint8 array (parties x 60) whose
    row ``u`` is the share survivor ``u`` sealed for it (uploaded in ``rows_by_party[u]``)."""
    first = next(iter(rows_by_party.values()))
    out = np.zeros_like(first)
    for u in survivors:
        if u != receiver:
            out[u] = rows_by_party[u][receiver]
    return out


def inbox_shares(rows: np.ndarray, survivors: Iterable[int], me: int) -> dict[int, bytes]:
    """Party: the sealed shares of an unmask request's inbox, by the survivor that sealed them."""
    rows = np.asarray(rows)
    if rows.dtype != np.uint8 or rows.ndim != 2 or rows.shape[1] != SEALED_SHARE_BYTES:
        raise SecAggError(f"an inbox of {rows.dtype} {rows.shape}; valid: uint8 rows of {SEALED_SHARE_BYTES} bytes")
    if any(not 0 <= int(u) < len(rows) for u in survivors):
        raise SecAggError(f"survivors {sorted(survivors)} outside the inbox's {len(rows)} rows")
    return {int(u): rows[int(u)].tobytes() for u in survivors if int(u) != me}


# --------------------------------------------------------------------------- server side
def recover_sum(
    masked_uploads: Mapping[int, np.ndarray],
    expected_parties: Iterable[int],
    encoder: FixedPointEncoder,
    responses: Mapping[int, tuple[Mapping[int, bytes], np.ndarray]],
    threshold: int,
    tag: str,
) -> np.ndarray:
    """Server, step 3: the survivors' sum after removing self and dropped masks.

    ``masked_uploads``: uploads of ``mask_recoverable`` (survivors only);
    ``responses[v] = unmask_response(...)`` of survivors that answered the
    unmask phase (at least ``threshold`` of them; the same ``threshold`` the
    parties split their seeds with).  Raises :class:`SecAggDropoutError` if
    fewer than ``threshold`` parties answer, :class:`SecAggError` if the sum lies
    beyond the survivors' declared bound (e.g. a threshold below the parties' one
    reconstructs wrong seeds).
    """
    expected = set(int(e) for e in expected_parties)
    surv, answered = _recovery_parties(masked_uploads, expected, responses, threshold)
    shape, arrs = check_uploads({int(k): v for k, v in masked_uploads.items()}, encoder.dtype)
    acc = sum_masked(arrs).reshape(-1)
    _remove_self_masks(acc, surv, answered, responses, threshold, str(tag))
    dropped = expected - surv
    if dropped:
        _remove_dropped_masks(acc, surv, answered, responses, dropped, encoder.dtype)
    return decode_honest_sum(encoder, acc.reshape(shape), len(surv))


def _recovery_parties(masked_uploads, expected: set[int], responses, threshold: int) -> tuple[set[int], set[int]]:
    """(survivors, parties that answered the unmask phase) of :func:`recover_sum`, once the threshold
    fits the ``expected`` parties and at least ``threshold`` of them uploaded and answered, none unexpected."""
    if not 2 <= int(threshold) <= len(expected):
        raise SecAggError(f"recover_sum: threshold={threshold}; valid: 2..{len(expected)} (the number of parties), "
                          "the value the parties split their seeds with")
    surv = set(int(k) for k in masked_uploads)
    if surv - expected:
        raise SecAggError(f"uploads from unexpected party id(s) {sorted(surv - expected)}")
    if len(surv) < threshold:
        raise SecAggDropoutError(expected - surv, f"only {len(surv)} uploads, threshold {threshold}")
    answered = set(int(k) for k in responses)
    if answered - surv:
        raise SecAggError(f"unmask responses from non-survivors {sorted(answered - surv)}")
    if len(answered) < threshold:
        raise SecAggDropoutError(surv - answered, f"only {len(answered)} unmask responses, threshold {threshold}")
    return surv, answered


def _remove_self_masks(acc: np.ndarray, surv: set[int], answered: set[int], responses, threshold: int,
                       tag: str) -> None:
    """Subtract from ``acc`` every survivor's self mask, its seed rebuilt from ``threshold`` shares."""
    for u in sorted(surv):
        shares = {}
        for v in sorted(answered):
            sh = responses[v][0].get(u)
            if sh is not None:
                shares[share_x(v)] = int.from_bytes(bytes(sh), "little")
            if len(shares) == threshold:
                break
        if len(shares) < threshold:
            raise SecAggDropoutError([u], f"only {len(shares)} shares of its self-mask seed, threshold {threshold}")
        np.subtract(acc, self_mask(shamir_reconstruct(shares), tag, acc.size, acc.dtype), out=acc)


def _remove_dropped_masks(acc: np.ndarray, surv: set[int], answered: set[int], responses, dropped: set[int],
                          dtype) -> None:
    """Subtract from ``acc`` every survivor's correction vector (its pair masks with the ``dropped``
    parties); every survivor must have sent one."""
    missing_corr = surv - answered
    if missing_corr:
        raise SecAggDropoutError(
            missing_corr, f"survivors must all answer to remove masks of dropped parties {sorted(dropped)}"
        )
    for v in sorted(answered):
        corr = np.asarray(responses[v][1])
        if corr.dtype != dtype or corr.size != acc.size:
            raise SecAggError(f"party {v}: bad correction vector (dtype {corr.dtype}, size {corr.size} != {acc.size})")
        np.subtract(acc, corr.reshape(-1), out=acc)
