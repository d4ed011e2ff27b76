"""Key agreement and sealed shares (common/secagg/keys.py): both ends agree, a share opens only
for its own (round, sender, receiver) and key, and a tampered token fails authentication."""

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

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


def test_only_p384_public_keys_are_accepted():
    other = ec.generate_private_key(ec.SECP256R1()).public_key()
    pem = other.public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    with pytest.raises(SecAggError, match="public keys must be on secp384r1"):
        keys.load_public(pem)
    with pytest.raises(SecAggError, match="not a PEM public key"):
        keys.load_public(b"garbage")
