"""The reverse check of the Java SDK's update codec: archives written by Java decode with the server's
`decode_update`. The Java build runs this module (JUnit's UpdateCodecGoldenTest sets FEDZOO_JAVA_ARCHIVES to the
archives it wrote and FEDZOO_JAVA_VECTORS to the golden vectors); in the Python suite alone it skips, saying so."""

import os
from pathlib import Path

import numpy as np
import pytest

from fedzoo.update_codec import decode_update, encode_update

ARCHIVES = os.environ.get("FEDZOO_JAVA_ARCHIVES")
VECTORS = os.environ.get("FEDZOO_JAVA_VECTORS")
pytestmark = pytest.mark.skipif(not (ARCHIVES and VECTORS),
                                reason="run by the Java build (mvn -f clients/java/pom.xml verify), which writes the archives")


def _delta() -> dict[str, np.ndarray]:
    with np.load(Path(VECTORS) / "codec_delta.npz") as archive:
        return {name: archive[name] for name in archive.files}


def test_java_fp32_archive_decodes_to_the_delta_exactly():
    decoded, encoding = decode_update((Path(ARCHIVES) / "fp32.npz").read_bytes(), max_decoded_bytes=1 << 20)
    assert encoding == "fp32"
    delta = _delta()
    assert sorted(decoded) == sorted(delta)
    for name, value in delta.items():
        assert decoded[name].dtype == np.float32 and np.array_equal(decoded[name], value), name


def test_java_int8_archive_decodes_as_pythons_own_encoding_does():
    decoded, encoding = decode_update((Path(ARCHIVES) / "int8.npz").read_bytes(), max_decoded_bytes=1 << 20)
    assert encoding == "int8"
    expected, _ = decode_update(encode_update(_delta(), "int8"))
    assert sorted(decoded) == sorted(expected)
    for name, value in expected.items():
        assert np.array_equal(decoded[name], value), name
