"""Key agreement and sealed shares (common/secagg/keys.py): both ends agree, a share opens only
for its own (round, sender, receiver) and key, and a tampered token fails authentication."""

import pytest
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from common.secagg import keys
from common.secagg.errors import SecAggError, ShareAuthError


def test_both_ends_agree_on_32_bytes_and_third_parties_do_not():
    (a, a_pub), (b, b_pub), (c, _) = keys.new_key_pair(), keys.new_key_pair(), keys.new_key_pair()
    assert keys.agree(a, b_pub) == keys.agree(b, a_pub) and len(keys.agree(a, b_pub)) == 32
    assert keys.agree(c, b_pub) != keys.agree(a, b_pub)


def test_the_private_scalar_round_trips():
    private, public = keys.new_key_pair()
    scalar = keys.private_to_scalar(private)
    assert len(scalar) == keys.SCALAR_BYTES and keys.public_bytes(keys.scalar_to_private(scalar)) == public


def _pair():
    (a, a_pub), (b, b_pub) = keys.new_key_pair(), keys.new_key_pair()
    return keys.agree(a, b_pub), keys.agree(b, a_pub)


def test_a_sealed_share_opens_only_where_it_was_sealed_for():
    sender_key, receiver_key = _pair()
    token = keys.seal_share(sender_key, (4, 10, 20), b"share bytes")
    assert keys.open_share(receiver_key, (4, 10, 20), token) == b"share bytes"
    for replay in [(5, 10, 20), (4, 20, 10), (4, 10, 21), (4, 11, 20)]:  # other round, reflected, other pair
        with pytest.raises(ShareAuthError, match="is bound to round 4, node 10 -> 20"):
            keys.open_share(receiver_key, replay, token)
    other_key, _ = _pair()
    with pytest.raises(
        ShareAuthError, match="round 4: the share from node 10 to node 20 failed authentication"
    ):
        keys.open_share(other_key, (4, 10, 20), token)


def test_a_tampered_token_fails_authentication():
    key, _ = _pair()
    token = bytearray(keys.seal_share(key, (1, 2, 3), b"x" * 64))
    token[len(token) // 2] ^= 1 if token[len(token) // 2] != ord("A") else 2  # stays base64
    with pytest.raises(ShareAuthError, match="failed authentication"):
        keys.open_share(key, (1, 2, 3), bytes(token))


def test_agreement_matches_rfc7748_vectors_then_hkdf():
    """RFC 7748 §6.1's Alice and Bob: the X25519 shared secret, then HKDF-SHA256 to 32 bytes."""
    alice = bytes.fromhex("77076d0a7318a57d3c16c17251b26645df4c2f87ebc0992ab177fba51db92c2a")
    bob_public = bytes.fromhex("de9edb7d7b7dc1b4d35b61c2ece435373f8343c85b78674dadfc7e146f882b4f")
    shared = bytes.fromhex("4a5d9d5ba4ce2de1728e3bf480350f25e07e21c947d19e3376f09b3c1e161742")
    private = keys.scalar_to_private(alice)
    assert (
        keys.public_bytes(private).hex() == "8520f0098930a754748b7ddcb43ef75a0dbf3a0d26381af4eba4a98eaa9b4e6a"
    )
    expected = HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=None).derive(shared)
    assert keys.agree(private, bob_public) == expected


def test_bad_public_keys_and_scalars_are_refused_in_one_line():
    private = X25519PrivateKey.generate()
    with pytest.raises(SecAggError, match="an X25519 public key has 32 bytes, got 31"):
        keys.agree(private, bytes(31))
    with pytest.raises(SecAggError, match="small-order point"):
        keys.agree(private, bytes(32))  # the identity: every shared secret would be zero
    with pytest.raises(SecAggError, match="an X25519 private scalar has 32 bytes, got 48"):
        keys.scalar_to_private(bytes(48))
