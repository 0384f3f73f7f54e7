"""The Ed25519 checks on devices' keys and signatures at their edges: encodings RFC 8032 refuses, points off the
curve, keys and signatures of the wrong length. `python bench/mutation.py fedzoo/secagg/signatures.py` found each
of these edges unguarded by the shared vectors."""

from fedzoo.secagg import signatures

FIELD = 2**255 - 19
D = -121665 * pow(121666, -1, FIELD) % FIELD


def _encoded(y: int, sign: int = 0) -> bytes:
    """A 32-byte Ed25519 point encoding: y little-endian, the sign of x in the top bit."""
    return (y | sign << 255).to_bytes(32, "little")


def _has_x(y: int) -> bool:
    """Whether some x puts (x, y) on the curve: x^2 = (y^2 - 1) / (d y^2 + 1) is a square (Euler's criterion)."""
    u = (y * y - 1) * pow(D * y * y + 1, -1, FIELD) % FIELD
    return u == 0 or pow(u, (FIELD - 1) // 2, FIELD) == 1


def test_only_canonical_encodings_of_points_on_the_curve_are_signing_keys():
    genuine = signatures.public_bytes(signatures.new_signing_key())
    assert signatures.is_signing_public_key(genuine)
    assert not signatures.is_signing_public_key(genuine[:31]) and not signatures.is_signing_public_key(genuine + b"\0")
    # y >= p is a second encoding of y - p: refused (RFC 8032, 5.1.3, step 1)
    assert not signatures.is_signing_public_key(_encoded(FIELD))
    assert not signatures.is_signing_public_key(_encoded(FIELD + 1))
    # y = 1 and y = p - 1 give x = 0, which has no negative: only the sign bit 0 encodes it
    for y in (1, FIELD - 1):
        assert signatures.is_signing_public_key(_encoded(y)) and not signatures.is_signing_public_key(_encoded(y, 1))
    found = {y: signatures.is_signing_public_key(_encoded(y)) for y in range(2, 60)}
    assert found == {y: _has_x(y) for y in found}
    assert set(found.values()) == {True, False}  # both kinds were tried


def test_a_signature_or_key_of_the_wrong_length_or_off_the_curve_never_verifies():
    key = signatures.new_signing_key()
    public, message = signatures.public_bytes(key), b"fedzoo signed message"
    signature = key.sign(message)
    assert signatures.verify(public, signature, message)
    assert not signatures.verify(public, signature[:-1], message)
    assert not signatures.verify(public, signature + b"\0", message)
    assert not signatures.verify(public[:31], signature, message)
    off_curve = next(y for y in range(2, 60) if not _has_x(y))
    assert not signatures.verify(_encoded(off_curve), signature, message)


def test_a_device_key_survives_its_stored_form():
    key = signatures.new_signing_key()
    stored = signatures.private_bytes(key)
    assert len(stored) == 32
    assert signatures.public_bytes(signatures.load_signing_key(stored)) == signatures.public_bytes(key)
