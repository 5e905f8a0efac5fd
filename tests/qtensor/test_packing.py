"""Packing of b-bit codes into uint8 / uint32 words and the native layout: exact round trips and layout."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from lowbit.errors import FormatError
from lowbit.qtensor.packing import (
    LAYOUTS,
    PackedCodes,
    code_dtype,
    code_range,
    pack_codes,
    packed_words,
    unpack_codes,
)

SHAPES = st.lists(st.integers(0, 13), min_size=0, max_size=3).map(tuple)


@st.composite
def codes_case(draw, widths=st.sampled_from([1, 2, 3, 4, 5, 6, 7, 8, 11, 12, 16, 24, 31, 32])):
    bits = draw(widths)
    signed = draw(st.booleans())
    shape = draw(SHAPES)
    low, high = code_range(bits, signed)
    values = draw(st.lists(st.integers(low, high), min_size=math.prod(shape), max_size=math.prod(shape)))
    return bits, signed, torch.tensor(values, dtype=torch.int64).reshape(shape)


@given(codes_case(), st.sampled_from(LAYOUTS))
def test_round_trip_is_exact_for_every_width_and_shape(case, layout):
    bits, signed, codes = case
    packed = pack_codes(codes, bits, signed=signed, layout=layout)
    out = unpack_codes(packed)
    assert out.dtype == code_dtype(bits, signed)
    assert out.shape == codes.shape
    assert torch.equal(out.to(torch.int64), codes)
    if layout != "native":
        word_bits = 8 if layout == "uint8" else 32
        assert packed.words.numel() == -(-codes.numel() * bits // word_bits)
        assert 0 <= packed.padding_bits < word_bits
        assert packed.padding_bits == packed.words.numel() * word_bits - codes.numel() * bits


@pytest.mark.parametrize("bits", [1, 2, 3, 4, 6])
@pytest.mark.parametrize("layout", ["uint8", "uint32"])
@pytest.mark.parametrize("signed", [False, True])
def test_extreme_codes_at_every_position_of_a_word(bits, layout, signed):
    low, high = code_range(bits, signed)
    # 97 codes: a prime count, so the codes start at every bit offset of a word and the tail is partial.
    codes = torch.tensor([low if i % 3 == 0 else high if i % 3 == 1 else (low + high) // 2 for i in range(97)])
    packed = pack_codes(codes.reshape(97, 1), bits, signed=signed, layout=layout)
    assert torch.equal(unpack_codes(packed).to(torch.int64).flatten(), codes)


def test_layout_is_little_endian_bit_stream():
    four = pack_codes(torch.tensor([1, 2, 3]), 4, signed=False, layout="uint8")
    assert four.words.tolist() == [0x21, 0x03] and four.padding_bits == 4
    # 3-bit codes cross byte boundaries: 5 | 6 << 3 | 7 << 6 = 0x1f5 -> bytes f5 01
    three = pack_codes(torch.tensor([5, 6, 7]), 3, signed=False, layout="uint8")
    assert three.words.tolist() == [0xF5, 0x01]
    signed_two = pack_codes(torch.tensor([-1, 0, 1, -2]), 2, signed=True, layout="uint8")
    assert signed_two.words.tolist() == [0b10_01_00_11]
    word = pack_codes(torch.arange(8), 4, signed=False, layout="uint32")
    assert word.words.dtype == torch.uint32 and word.words.to(torch.int64).tolist() == [0x76543210]


def test_native_layout_uses_plain_integer_dtypes():
    packed = pack_codes(torch.tensor([[-128, 127]]), 8, signed=True, layout="native")
    assert packed.words.dtype == torch.int8 and packed.words.shape == (1, 2)
    assert pack_codes(torch.tensor([255]), 8, signed=False, layout="native").words.dtype == torch.uint8
    assert code_dtype(4, True) == torch.int8 and code_dtype(16, False) == torch.int32


def test_sub_byte_packing_saves_the_expected_space():
    codes = torch.zeros(1000, dtype=torch.int64)
    assert pack_codes(codes, 4, signed=False, layout="uint8").nbytes == 500
    assert pack_codes(codes, 3, signed=False, layout="uint8").nbytes == 375
    assert pack_codes(codes, 6, signed=False, layout="uint32").nbytes == 4 * packed_words(1000, 6, "uint32")


def test_codes_outside_the_width_are_rejected():
    with pytest.raises(FormatError, match="do not fit in 3 unsigned bits"):
        pack_codes(torch.tensor([8]), 3, signed=False)
    with pytest.raises(FormatError, match="do not fit in 4 signed bits"):
        pack_codes(torch.tensor([-9]), 4, signed=True)
    with pytest.raises(FormatError, match="bits=0"):
        pack_codes(torch.tensor([0]), 0, signed=False)
    with pytest.raises(FormatError, match="integer tensor"):
        pack_codes(torch.tensor([0.5]), 4, signed=False)


def test_wrong_word_count_is_rejected():
    packed = pack_codes(torch.arange(10), 4, signed=False, layout="uint8")
    short = PackedCodes(packed.words[:-1], 4, False, (10,), "uint8")
    with pytest.raises(FormatError, match="need 5 uint8 words, got 4"):
        unpack_codes(short)


def test_stored_words_of_the_wrong_kind_are_rejected():
    with pytest.raises(FormatError, match="dtype torch.uint8, got torch.int8"):
        unpack_codes(PackedCodes(torch.zeros(2, dtype=torch.int8), 4, False, (4,), "uint8"))
    with pytest.raises(FormatError, match="stored as integers"):
        unpack_codes(PackedCodes(torch.zeros(4), 8, True, (4,), "native"))
    with pytest.raises(FormatError, match="outside the 4-bit range"):
        unpack_codes(PackedCodes(torch.tensor([9], dtype=torch.int8), 4, True, (1,), "native"))
    with pytest.raises(FormatError, match="do not match shape"):
        unpack_codes(PackedCodes(torch.zeros(3, dtype=torch.int8), 8, True, (4,), "native"))
