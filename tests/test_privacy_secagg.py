"""Secure aggregation: exact cancellation, uniformity, fresh masks, dropouts, overflow."""

import numpy as np
import pytest
from scipy.stats import chisquare

from fedgraphcore.privacy.secagg_recovery import mask_recoverable, recover_sum, unmask_response
from fedgraphcore.privacy.secagg import (
    FixedPointEncoder,
    SecAggDropoutError,
    SecAggError,
    SecAggOverflowError,
    SecAggParty,
    relay_public_keys,
    sum_masked,
    finest_scale,
    unmask_sum,
)


def make_parties(ids, session="test-session"):
    parties = [SecAggParty.generate(i, session) for i in ids]
    keys = relay_public_keys({p.party_id: p.public_key_bytes() for p in parties})
    for p in parties:
        p.agree(keys)
    return parties, keys


SHAPES = [(1,), (7,), (3, 5), (2, 3, 4), (1000,)]


@pytest.mark.parametrize("P", list(range(2, 17)))
def test_masks_cancel_exactly(P):
    rng = np.random.default_rng(P)
    # Flower-like node ids: large, non-contiguous
    ids = [int(x) for x in rng.choice(2**62, size=P, replace=False)]
    parties, keys = make_parties(ids)
    enc = FixedPointEncoder(scale=2.0**20, bound=50.0, num_parties=P)
    for k, shape in enumerate(SHAPES):
        xs = {p.party_id: rng.uniform(-50, 50, shape) for p in parties}
        ups = {p.party_id: p.mask(xs[p.party_id], f"r{k}/t", enc) for p in parties}
        for pid, u in ups.items():
            assert u.dtype == enc.dtype and u.shape == shape
            assert not np.array_equal(u, enc.encode(xs[pid]))  # actually masked
        # exact in the ring: sum of masked == sum of encodings (mod 2^w), bit for bit
        assert np.array_equal(sum_masked(list(ups.values())), sum_masked([enc.encode(x) for x in xs.values()]))
        s = unmask_sum(ups, set(keys), enc)
        true = np.sum(list(xs.values()), axis=0)
        assert np.max(np.abs(s - true)) <= P / (2 * enc.scale) + 1e-12


def test_negative_values_and_extremes_decode_exactly():
    P = 5
    parties, keys = make_parties(range(P))
    enc = FixedPointEncoder(scale=1.0, bound=2.0**60, num_parties=P)
    # integers at the bound: fixed-point exact, sum = +-5 * 2^60 (close to the signed limit 2^63)
    for sign, tag in ((1, "pos"), (-1, "neg")):
        xs = {p.party_id: np.full(4, sign * 2.0**60) for p in parties}
        ups = {p.party_id: p.mask(xs[p.party_id], tag, enc) for p in parties}
        assert np.array_equal(unmask_sum(ups, set(keys), enc), np.full(4, sign * 5 * 2.0**60))


def _top_bits_chisq(u, bits=8):
    top = (u >> u.dtype.type(8 * u.itemsize - bits)).astype(np.int64)
    counts = np.bincount(top, minlength=2**bits)
    return chisquare(counts).pvalue


@pytest.mark.parametrize("bound,ring", [(1.0, 32), (1e6, 64)])
def test_single_masked_upload_is_uniform(bound, ring):
    parties, _ = make_parties(range(3))
    enc = FixedPointEncoder(scale=2.0**16, bound=bound, num_parties=3)
    assert enc.ring_bits == ring
    x = np.full(2**18, 0.25)  # constant, highly non-uniform plaintext
    u = parties[1].mask(x, "round0/tensor", enc)
    assert _top_bits_chisq(u) > 1e-6
    low = (u & u.dtype.type(0xFF)).astype(np.int64)
    assert chisquare(np.bincount(low, minlength=256)).pvalue > 1e-6
    # negative control: the same test rejects the unmasked encoding
    assert _top_bits_chisq(enc.encode(x)) < 1e-6
    # and rejects a "mask" of the wrong kind (only the low half of the bits random)
    half = np.random.default_rng(0).integers(0, 2 ** (ring // 2), x.size, dtype=np.uint64).astype(enc.dtype)
    assert _top_bits_chisq(enc.encode(x) + half) < 1e-6


def test_ring_is_the_smallest_that_holds_the_sum():
    # 16 parties, resolution 2^-20: |part| <= 4 fits Z_2^32, the default bound 1e6 needs Z_2^64
    assert FixedPointEncoder(2.0**20, 4.0, 16).dtype == np.uint32
    assert FixedPointEncoder(2.0**20, 1e6, 16).dtype == np.uint64
    # the edge: num_parties * max_q = 2^31 - 1 fits the signed 32-bit range, 2^31 does not
    assert FixedPointEncoder(1.0, 2.0**31 - 1, 1).ring_bits == 32
    assert FixedPointEncoder(1.0, 2.0**30, 2).ring_bits == 64
    # sums at the edge of the small ring decode exactly, both signs
    P = 7
    parties, keys = make_parties(range(P))
    enc = FixedPointEncoder(scale=1.0, bound=float((2**31 - 1) // P), num_parties=P)
    assert enc.ring_bits == 32
    for sign, tag in ((1, "pos"), (-1, "neg")):
        xs = {p.party_id: np.full(4, sign * enc.bound) for p in parties}
        ups = {p.party_id: p.mask(xs[p.party_id], tag, enc) for p in parties}
        assert np.array_equal(unmask_sum(ups, set(keys), enc), np.full(4, sign * P * enc.bound))


@pytest.mark.parametrize("bound, parties, bits, expected", [
    (4.0 + 1e-9, 2, 32, 2.0**27), (4.0 + 1e-9, 16, 32, 2.0**24), (4.0, 2, 32, 2.0**27), (1e6, 16, 64, 2.0**39),
    (3.0, 5, 32, 2.0**27)])
def test_finest_scale_is_the_largest_power_of_two_the_ring_holds(bound, parties, bits, expected):
    assert finest_scale(bound, parties, bits) == expected
    assert FixedPointEncoder(expected, bound, parties).ring_bits == bits
    if bits == 32:  # twice as fine needs the next ring
        assert FixedPointEncoder(2 * expected, bound, parties).ring_bits == 64
    else:
        with pytest.raises(SecAggOverflowError):
            FixedPointEncoder(2 * expected, bound, parties)
    with pytest.raises(ValueError, match="ring_bits must be one of"):
        finest_scale(bound, parties, 16)


def test_finest_scale_of_a_tiny_bound_is_the_largest_float_power_of_two():
    # limit / (parties * bound) would overflow to inf; no float64 scale is finer than 2^1023
    assert finest_scale(1e-300, 2, 64) == 2.0**1023
    assert FixedPointEncoder(2.0**1023, 1e-300, 2).max_q == round(1e-300 * 2.0**1023)


def test_small_ring_sum_equals_large_ring_sum_bit_for_bit():
    """The same values and resolution give the same decoded sum in either ring:
    the smaller ring only halves the bytes."""
    P = 16
    parties, keys = make_parties(range(P))
    small, large = FixedPointEncoder(2.0**20, 4.0, P), FixedPointEncoder(2.0**20, 1e6, P)
    rng = np.random.default_rng(3)
    xs = {p.party_id: rng.uniform(0, 4, (50, 17)) for p in parties}
    sums = {}
    for enc in (small, large):
        ups = {p.party_id: p.mask(xs[p.party_id], f"ring{enc.ring_bits}", enc) for p in parties}
        assert all(u.nbytes == xs[0].size * enc.ring_bits // 8 for u in ups.values())
        sums[enc.ring_bits] = unmask_sum(ups, set(keys), enc)
    assert np.array_equal(sums[32], sums[64])
    # an upload in the other ring is refused, naming both
    ups = {p.party_id: p.mask(xs[p.party_id], "mixed", small) for p in parties}
    ups[5] = ups[5].astype(np.uint64)
    with pytest.raises(SecAggError, match="must be uint32 .*got uint64"):
        unmask_sum(ups, set(keys), small)


def test_fresh_masks_per_tag_and_session():
    parties, _ = make_parties(range(3), "s1")
    enc = FixedPointEncoder(2.0**16, 1.0, 3)
    x = np.zeros(4096)
    a = parties[0].mask(x, "round0/t", enc)
    b = parties[0].mask(x, "round1/t", enc)
    c = parties[0].mask(x, "round0/u", enc)
    for p, q in ((a, b), (a, c), (b, c)):
        assert np.mean(p == q) < 0.01
    with pytest.raises(SecAggError, match="already used"):
        parties[0].mask(x, "round0/t", enc)
    # same ids, new session id -> different masks under the same tag
    parties2, _ = make_parties(range(3), "s2")
    a2 = parties2[0].mask(x, "round0/t", enc)
    assert np.mean(a == a2) < 0.01


def test_missing_party_detected():
    parties, keys = make_parties([3, 8, 11, 20])
    enc = FixedPointEncoder(2.0**20, 10.0, 4)
    xs = {p.party_id: np.ones(100) for p in parties}
    ups = {p.party_id: p.mask(xs[p.party_id], "r", enc) for p in parties}
    partial = {k: v for k, v in ups.items() if k not in (8, 20)}
    with pytest.raises(SecAggDropoutError, match=r"\[8, 20\]") as ei:
        unmask_sum(partial, set(keys), enc)
    assert ei.value.missing == [8, 20]
    assert "\n" not in str(ei.value)
    # without the check the "sum" would be garbage: masks do not cancel
    assert not np.allclose(enc.decode(sum_masked(list(partial.values()))), 2.0)
    with pytest.raises(SecAggError, match="unexpected"):
        unmask_sum(ups, {3, 8, 11}, enc)
    with pytest.raises(SecAggDropoutError):
        relay_public_keys({3: parties[0].public_key_bytes()}, expected_parties={3, 8})


def test_a_sum_whose_masks_do_not_cancel_is_refused():
    parties, keys = make_parties(range(3))
    enc = FixedPointEncoder(2.0**20, 10.0, 3)
    ups = {p.party_id: p.mask(np.ones(64), "r", enc) for p in parties}
    ups[2] = parties[2].mask(np.ones(64), "other-step", enc)  # masked, but for another step
    with pytest.raises(SecAggError, match=r"beyond 3 x the declared bound 10: an upload is not an honest encoding "
                                          r"masked for this step"):
        unmask_sum(ups, set(keys), enc)
    # a sum over more parties than the encoder was declared for may have wrapped
    with pytest.raises(SecAggOverflowError, match="4 parties with an encoder declared for num_parties=3"):
        unmask_sum({**ups, 3: ups[0]}, set(keys) | {3}, enc)


def test_recovery_with_another_threshold_than_the_parties_is_refused():
    P, thr = 5, 3
    parties, keys = make_parties(range(P))
    enc = FixedPointEncoder(2.0**20, 10.0, P)
    xs = {i: np.full(8, float(i)) for i in range(P)}
    ups, _, surv, resp = _recover_round(parties, keys, enc, xs, "r0", thr, [])
    assert np.array_equal(recover_sum(ups, set(keys), enc, resp, thr, "r0"), np.full(8, 10.0))
    # too few shares per seed: wrong self-mask seeds, a "sum" of noise
    with pytest.raises(SecAggError, match="a self-mask seed was rebuilt from wrong shares"):
        recover_sum(ups, set(keys), enc, resp, thr - 1, "r0")
    for bad in (1, P + 1):
        with pytest.raises(SecAggError, match=rf"threshold={bad}; valid: 2..{P}"):
            recover_sum(ups, set(keys), enc, resp, bad, "r0")


def test_shape_and_dtype_mismatch():
    parties, keys = make_parties(range(2))
    enc = FixedPointEncoder(2.0**20, 10.0, 2)
    u0 = parties[0].mask(np.ones(5), "r", enc)
    u1 = parties[1].mask(np.ones(6), "r", enc)
    with pytest.raises(SecAggError, match="shape"):
        unmask_sum({0: u0, 1: u1}, set(keys), enc)
    with pytest.raises(SecAggError, match=f"must be {enc.dtype}.*got float64"):
        unmask_sum({0: u0, 1: u0.astype(np.float64)}, set(keys), enc)


def test_overflow_guard():
    with pytest.raises(SecAggOverflowError, match="2\\^63"):
        FixedPointEncoder(scale=2.0**40, bound=2.0**20, num_parties=16)  # 2^64 > 2^63
    FixedPointEncoder(scale=2.0**40, bound=2.0**18, num_parties=16)  # 2^62: fits
    enc = FixedPointEncoder(scale=2.0**20, bound=5.0, num_parties=3)
    with pytest.raises(SecAggOverflowError) as err:
        enc.encode(np.array([1.0, -7.5, 2.0]))
    # the error goes back to the server, which chose the bound: it names the bound, never the private value
    assert str(err.value) == ("FixedPointEncoder.encode: a value exceeds the declared bound 5 in absolute value; "
                              "valid: |value| <= bound (raise secagg.bound)")
    with pytest.raises(SecAggOverflowError, match="non-finite"):
        enc.encode(np.array([np.nan]))
    with pytest.raises(ValueError, match="num_parties must be a whole number, got 2.7"):
        FixedPointEncoder(scale=1.0, bound=1.0, num_parties=2.7)
    # party refuses an encoder that declares fewer parties than the aggregation has
    parties, _ = make_parties(range(4))
    with pytest.raises(SecAggOverflowError, match="num_parties=3"):
        parties[0].mask(np.ones(3), "r", enc)


def test_state_roundtrip_and_key_checks():
    parties, keys = make_parties(range(3))
    enc = FixedPointEncoder(2.0**20, 10.0, 3)
    clone = SecAggParty.from_bytes(parties[0].to_bytes())
    clone2 = SecAggParty.from_array(parties[0].to_array())
    x = np.arange(10.0)
    m0 = parties[0].mask(x, "t", enc)
    assert np.array_equal(m0, clone.mask(x, "t", enc))
    assert np.array_equal(m0, clone2.mask(x, "t", enc))
    restored = SecAggParty.from_bytes(clone.to_bytes())
    with pytest.raises(SecAggError, match="already used"):
        restored.mask(x, "t", enc)
    # relayed key for own id must be our own key; duplicated keys rejected
    fresh = SecAggParty.generate(0, "test-session")
    with pytest.raises(SecAggError, match="own id"):
        fresh.agree(keys)
    bad = dict(keys)
    bad[1] = bad[2]
    with pytest.raises(SecAggError, match="two parties advertised the same public key"):
        relay_public_keys(bad)
    with pytest.raises(SecAggError, match="parties 1 and 2 advertised the same public key"):
        parties[0].agree(bad)
    with pytest.raises(SecAggError, match="party 1: public key must be 32 bytes, got str"):
        relay_public_keys({**keys, 1: "abc"})


def _recover_round(parties, keys, enc, xs, tag, thr, dropped, late_drop=()):
    ups, cts = {}, {}
    for p in parties:
        ups[p.party_id], cts[p.party_id] = mask_recoverable(p, xs[p.party_id], tag, enc, thr)
    surv = sorted(set(keys) - set(dropped))
    n = next(iter(ups.values())).size
    resp = {}
    for p in parties:
        if p.party_id in surv and p.party_id not in late_drop:
            resp[p.party_id] = unmask_response(
                p, tag, surv, sorted(dropped), {u: cts[u][p.party_id] for u in surv if u != p.party_id}, n, enc
            )
    return ups, cts, surv, resp


@pytest.mark.parametrize("P,dropped,bound", [(4, [], 10.0), (5, [2], 10.0), (8, [0, 7], 1e6), (10, [1, 4, 5], 10.0)])
def test_dropout_recovery(P, dropped, bound):
    ids = list(range(P))
    parties, keys = make_parties(ids)
    enc = FixedPointEncoder(2.0**20, bound, P)
    rng = np.random.default_rng(P)
    xs = {i: rng.uniform(-10, 10, (6, 3)) for i in ids}
    thr = P // 2 + 1
    ups, cts, surv, resp = _recover_round(parties, keys, enc, xs, "r0", thr, dropped)
    assert all(u.dtype == enc.dtype for u in ups.values()) and all(r[1].dtype == enc.dtype for r in resp.values())
    s = recover_sum({u: ups[u] for u in surv}, set(keys), enc, resp, thr, "r0")
    assert np.max(np.abs(s - np.sum([xs[u] for u in surv], axis=0))) <= P / (2 * enc.scale) + 1e-12
    # the simple protocol aborts on the same uploads if anyone dropped
    if dropped:
        with pytest.raises(SecAggDropoutError):
            unmask_sum({u: ups[u] for u in surv}, set(keys), enc)


def test_recovery_protections():
    P, thr = 5, 3
    parties, keys = make_parties(range(P))
    enc = FixedPointEncoder(2.0**20, 10.0, P)
    xs = {i: np.full(2**16, float(i)) for i in range(P)}
    ups, cts, surv, resp = _recover_round(parties, keys, enc, xs, "r0", thr, [4])
    # a late upload of the "dropped" party 4 stays hidden: removing all pairwise
    # masks (which the server now knows via the corrections) leaves the self mask
    pair_only = ups[4].copy()
    for v in surv:
        np.add(pair_only, resp[v][1], out=pair_only)  # corrections are v's signed masks with 4 = -(4's)
    assert np.mean(pair_only == enc.encode(xs[4])) < 0.01
    assert _top_bits_chisq(pair_only - enc.encode(xs[4])) > 1e-6  # what remains is the (uniform) self mask
    # a party answers only one dropout split per tag
    with pytest.raises(SecAggError, match="different dropout set"):
        unmask_response(parties[0], "r0", list(range(P)), [], {u: cts[u][0] for u in range(1, P)}, 2**16, enc)
    # too few survivors -> abort
    with pytest.raises(SecAggDropoutError):
        recover_sum({u: ups[u] for u in surv[:2]}, set(keys), enc, {}, thr, "r0")
    # tampered share ciphertext is rejected
    ups2, cts2 = {}, {}
    for p in parties:
        ups2[p.party_id], cts2[p.party_id] = mask_recoverable(p, xs[p.party_id], "r1", enc, thr)
    ct = bytearray(cts2[1][0])
    ct[-1] ^= 1
    with pytest.raises(SecAggError, match="authentication"):
        unmask_response(parties[0], "r1", list(range(P)), [], {1: bytes(ct), 2: cts2[2][0], 3: cts2[3][0], 4: cts2[4][0]}, 2**16, enc)


def test_participant_subset_per_round():
    parties, keys = make_parties([2, 5, 9, 13, 17])
    enc = FixedPointEncoder(2.0**20, 20.0, 5)
    sampled = [5, 9, 17]
    xs = {i: np.full(64, float(i)) for i in sampled}
    by = {p.party_id: p for p in parties}
    ups = {i: by[i].mask(xs[i], "round3/t", enc, participants=sampled) for i in sampled}
    assert np.allclose(unmask_sum(ups, sampled, enc), 31.0, atol=1e-5)
    # masking over all agreed parties instead would not cancel among the sampled ones
    ups_all = {i: by[i].mask(xs[i], "round4/t", enc) for i in sampled}
    with pytest.raises(SecAggDropoutError, match=r"\[2, 13\]"):
        unmask_sum(ups_all, set(keys), enc)
    assert not np.allclose(enc.decode(sum_masked(list(ups_all.values()))), 31.0)
    with pytest.raises(SecAggError, match="no agreed key"):
        by[5].mask(xs[5], "round5/t", enc, participants=[5, 99])


def test_roundtrip_through_flower_records():
    """State, keys, masked arrays and share ciphertexts survive Flower records."""
    flwr_app = pytest.importorskip("flwr.app")
    from fedgraphcore.privacy.secagg import pack_id_bytes, unpack_id_bytes

    ids = [101, 202, 303]
    parties = [SecAggParty.generate(i, "flwr-run") for i in ids]
    adv = {p.party_id: flwr_app.ConfigRecord({"pk": p.public_key_bytes()})["pk"] for p in parties}
    relay = flwr_app.ConfigRecord(pack_id_bytes(relay_public_keys(adv)))
    states = {}
    for p in parties:
        p.agree(unpack_id_bytes(dict(relay)))
        states[p.party_id] = flwr_app.ConfigRecord({"party": p.to_bytes()})
    enc = FixedPointEncoder(2.0**20, 10.0, 3)
    replies, cts = {}, {}
    for i in ids:
        party = SecAggParty.from_bytes(states[i]["party"])
        y, ct = mask_recoverable(party, np.full((4, 2), float(i) / 100), "r0", enc, 2)
        rec = flwr_app.ArrayRecord({"y": flwr_app.Array(y)})
        replies[i] = rec["y"].numpy()
        cts[i] = unpack_id_bytes(dict(flwr_app.ConfigRecord(pack_id_bytes(ct))))
        states[i] = flwr_app.ConfigRecord({"party": party.to_bytes()})
    surv, drop = [101, 303], [202]
    resp = {}
    for i in surv:
        party = SecAggParty.from_bytes(states[i]["party"])
        resp[i] = unmask_response(party, "r0", surv, drop, {u: cts[u][i] for u in surv if u != i}, 8, enc)
    s = recover_sum({u: replies[u] for u in surv}, ids, enc, resp, 2, "r0")
    assert np.allclose(s, 4.04, atol=1e-5)
