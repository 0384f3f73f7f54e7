"""The wire format of weight deltas: float32 round trips exactly, INT8 within half a step, bad archives refused."""

import io
import zipfile

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import array_shapes, arrays

from fedzoo.update_codec import UpdateFormatError, decode_update, encode_update, quantize_int8

finite_floats = st.floats(min_value=-1e4, max_value=1e4, allow_nan=False, allow_infinity=False, width=32)
deltas = st.dictionaries(
    keys=st.from_regex(r"[a-z][a-z0-9_.:]{0,20}", fullmatch=True),
    values=arrays(np.float32, array_shapes(min_dims=0, max_dims=3, max_side=6), elements=finite_floats),
    min_size=1,
    max_size=4,
)


@settings(max_examples=60, deadline=None)
@given(deltas)
def test_fp32_round_trip_is_exact(delta):
    decoded, encoding = decode_update(encode_update(delta, "fp32"))
    assert encoding == "fp32"
    assert sorted(decoded) == sorted(delta)
    for name, value in delta.items():
        assert decoded[name].dtype == np.float32
        np.testing.assert_array_equal(decoded[name], value)


@settings(max_examples=60, deadline=None)
@given(deltas)
def test_int8_round_trip_is_within_half_a_quantization_step(delta):
    decoded, encoding = decode_update(encode_update(delta, "int8"))
    assert encoding == "int8"
    assert sorted(decoded) == sorted(delta)
    for name, value in delta.items():
        largest = float(np.max(np.abs(value))) if value.size else 0.0
        half_step = max(largest / 127, float(np.finfo(np.float32).tiny)) / 2
        assert decoded[name].shape == value.shape
        assert np.all(np.abs(decoded[name] - value) <= half_step * 1.001 + 1e-12)


def test_int8_is_about_four_times_smaller_for_a_realistic_model():
    rng = np.random.default_rng(0)
    delta = {f"layer{i}.weight": rng.normal(0, 0.01, size=(64, 64)).astype(np.float32) for i in range(4)}
    ratio = len(encode_update(delta, "fp32")) / len(encode_update(delta, "int8"))
    assert ratio > 3.5


def test_a_subnormal_delta_still_gets_a_valid_scale():
    decoded, _ = decode_update(encode_update({"w": np.array([1e-45, -1e-45], np.float32)}, "int8"))
    assert np.all(np.abs(decoded["w"]) <= 1e-38)


def test_zero_delta_quantizes_to_zero():
    quantized, scale = quantize_int8(np.zeros((3, 3), dtype=np.float32))
    assert scale > 0 and not quantized.any()


def test_decoded_size_limit_refuses_an_oversized_archive():
    data = encode_update({"w": np.zeros(10_000, dtype=np.float32)})
    with pytest.raises(UpdateFormatError, match="expands to"):
        decode_update(data, max_decoded_bytes=1_000)


def test_garbage_and_wrong_dtype_are_refused_with_the_field_named():
    with pytest.raises(UpdateFormatError, match="not an .npz archive"):
        decode_update(b"definitely not a zip")
    buffer = io.BytesIO()
    np.savez(buffer, w=np.zeros(3, dtype=np.float64))
    with pytest.raises(UpdateFormatError, match="float64") as error:
        decode_update(buffer.getvalue())
    assert error.value.field == "w"


def _int8_archive(**arrays):
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    return buffer.getvalue()


def test_int8_archive_missing_its_scales_or_with_a_wrong_layout_is_refused():
    layout = np.array('[["w", [3]]]')
    with pytest.raises(UpdateFormatError, match="@scales"):
        decode_update(_int8_archive(**{"@layout": layout, "@values": np.zeros(3, np.int8)}))
    scales = np.ones(1, np.float32)
    with pytest.raises(UpdateFormatError, match="3 int8 values"):
        decode_update(_int8_archive(**{"@layout": layout, "@scales": scales, "@values": np.zeros(4, np.int8)}))
    with pytest.raises(UpdateFormatError, match="distinct"):
        decode_update(_int8_archive(**{"@layout": np.array("not json"), "@scales": scales,
                                       "@values": np.zeros(3, np.int8)}))


def test_int8_is_over_four_times_smaller_even_for_many_small_tensors():
    rng = np.random.default_rng(1)  # a zoo CNN's shapes: 24 tensors, 4,098 weights, most tensors tiny
    shapes = [(10, 32), (10,), (8, 1, 3, 3), (8,), (16, 8, 1, 1), (16,), (16, 1, 3, 3), (16,), (8, 16, 1, 1), (8,),
              (16, 8, 1, 1), (16,), (16, 1, 3, 3), (16,), (16, 16, 1, 1), (16,), (32, 16, 1, 1), (32,), (32, 1, 3, 3),
              (32,), (24, 32, 1, 1), (24,), (32, 24, 1, 1), (32,)]
    delta = {f"p{index}": rng.normal(0, 0.01, size=shape).astype(np.float32) for index, shape in enumerate(shapes)}
    assert len(encode_update(delta, "fp32")) / len(encode_update(delta, "int8")) > 4


def test_reserved_names_and_unknown_encodings_are_refused():
    with pytest.raises(ValueError, match="reserved"):
        encode_update({"@layout": np.zeros(1, dtype=np.float32)})
    with pytest.raises(ValueError, match="unknown update encoding"):
        encode_update({"w": np.zeros(1, dtype=np.float32)}, "int4")  # type: ignore[arg-type]


def test_archive_is_a_plain_npz_without_pickles():
    data = encode_update({"w": np.ones(2, dtype=np.float32)}, "int8")
    with zipfile.ZipFile(io.BytesIO(data)) as archive:
        assert sorted(archive.namelist()) == ["@layout.npy", "@scales.npy", "@values.npy"]


def _npz_declaring(shape, descr="<f4", data_bytes=64):
    """An archive whose one member's .npy header declares `shape` but holds only `data_bytes` bytes."""
    member = io.BytesIO()
    np.lib.format.write_array_header_1_0(member, {"descr": descr, "fortran_order": False, "shape": shape})
    member.write(b"\0" * data_bytes)
    archive = io.BytesIO()
    with zipfile.ZipFile(archive, "w") as writer:
        writer.writestr("w.npy", member.getvalue())
    return archive.getvalue()


def test_a_header_declaring_more_values_than_the_member_holds_is_refused_before_reading():
    # the probe's archive: 1e12 float32 declared in a few hundred bytes (numpy would allocate 4 TB first)
    with pytest.raises(UpdateFormatError, match="declares") as error:
        decode_update(_npz_declaring((10**12,)), max_decoded_bytes=1 << 20)
    assert error.value.field == "delta"
    with pytest.raises(UpdateFormatError, match="declares"):
        decode_update(_npz_declaring((17,)))  # 68 bytes declared, 64 held
    assert decode_update(_npz_declaring((16,)))[0]["w"].shape == (16,)  # exactly what it holds: fine
