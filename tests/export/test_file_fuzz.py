"""Fuzz of lowbit files: every bit-flipped byte and every edited header value of small saved models (real
and simulated layers, QTensors) either loads bit-identically or raises SerializationError; none loads a
different model, none escapes as another exception, none allocates by a forged size."""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn

import lowbit
from lowbit.export import SerializationError

pytest.importorskip("safetensors")
from lowbit.export.safetensors_io import parse, seal


def architecture() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Sequential(nn.Linear(16, 8)), nn.ReLU(), nn.Sequential(nn.Linear(8, 8)), nn.Linear(8, 4))


def quantized_model() -> nn.Module:
    model = architecture()
    lowbit.quantize_model(model[0], "int8_dynamic")  # real layer
    lowbit.quantize_model(model[2], "mxfp4_e2m1")  # simulated layer
    return model


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    folder = tmp_path_factory.mktemp("fuzz")
    x = torch.linspace(-3, 3, 96).reshape(6, 16)
    saved = {"model": (quantized_model(), folder / "model.safetensors"),
             "tensors": ({"w": lowbit.encode(x, "q4s", block_size=[1, 8]), "m": lowbit.encode(x, "mxfp4_e2m1"),
                          "b": torch.arange(5.0)}, folder / "tensors.safetensors")}  # fmt: skip
    for obj, path in saved.values():
        lowbit.save(obj, path)
    return {name: path.read_bytes() for name, (_, path) in saved.items()}


def bits(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.view(torch.uint8) if tensor.dtype.is_floating_point else tensor


def same(a, b) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape and torch.equal(bits(a), bits(b))
    return same(a.codes, b.codes) and a.spec == b.spec and all(same(a.params[k], b.params[k]) for k in a.params)


def state_of(blob: bytes) -> dict:
    from lowbit.export.safetensors_io import _load_entry

    header, tensors = parse(blob, "fuzzed")
    return {name: _load_entry(name, entry, tensors) for name, entry in header["entries"].items()}


def loads_same_or_refuses(blob: bytes, original: dict) -> bool:
    """True when the bytes load as ``original`` bit for bit, False when they are refused."""
    try:
        state = state_of(blob)
    except SerializationError:
        return False
    assert state.keys() == original.keys() and all(same(state[k], original[k]) for k in original)
    return True


@pytest.mark.parametrize("name", ["model", "tensors"])
def test_every_flipped_bit_of_every_byte_is_refused(files, name):
    blob, original = files[name], state_of(files[name])
    size = int.from_bytes(blob[:8], "little")
    regions = {"length prefix": range(8), "header": range(8, 8 + size), "data": range(8 + size, len(blob))}
    for region, positions in regions.items():
        for position in positions:
            for bit in (position % 8, (position + 3) % 8):
                mutated = bytearray(blob)
                mutated[position] ^= 1 << bit
                assert not loads_same_or_refuses(bytes(mutated), original), (region, position, bit)


def test_flipped_files_refused_by_load_with_a_model(files, tmp_path):
    blob = files["model"]
    path = tmp_path / "m.safetensors"
    for position in range(0, len(blob), 97):
        mutated = bytearray(blob)
        mutated[position] ^= 0x04
        path.write_bytes(bytes(mutated))
        with pytest.raises(SerializationError, match="m.safetensors"):
            lowbit.load(path, architecture())
    path.write_bytes(blob)
    loaded, reference = lowbit.load(path, architecture()), quantized_model()
    x = torch.randn(3, 16)
    assert torch.equal(loaded(x), reference(x))


def leaves(value, path=()):
    """(path, value) of every JSON leaf, and of every list / dict as a whole."""
    yield path, value
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for key, item in items:
        yield from leaves(item, (*path, key))


def edits(value):
    if isinstance(value, bool):
        return [not value]
    if isinstance(value, int):
        return [value + 1, value - 1, -1, 2**40]
    if isinstance(value, float):
        return [value * 2]
    if isinstance(value, str):
        known = {"F32": ["I32", "F16"], "I8": ["U8"], "U8": ["I8"]}
        return known.get(value, []) + [value + "x", ""]
    if isinstance(value, list):
        return [[], value[:-1], [*value, 1]]
    if isinstance(value, dict):
        return [{}]
    return ["x"]


def header_edits(blob: bytes):
    """Files with one header value edited (lowbit header inside the safetensors header included)."""
    size = int.from_bytes(blob[:8], "little")
    raw = json.loads(blob[8 : 8 + size])
    lowbit_header = json.loads(raw["__metadata__"]["lowbit"])
    for where, document in (("safetensors", raw), ("lowbit", lowbit_header)):
        for path, value in list(leaves(document)):
            if not path or path[-1] == "seal_sha256" and where == "lowbit":
                continue
            for replacement in edits(value):
                edited_raw, edited_lowbit = json.loads(json.dumps(raw)), json.loads(json.dumps(lowbit_header))
                target = edited_raw if where == "safetensors" else edited_lowbit
                for key in path[:-1]:
                    target = target[key]
                target[path[-1]] = replacement
                if where == "lowbit":
                    edited_raw["__metadata__"]["lowbit"] = json.dumps(edited_lowbit)
                elif path[0] == "__metadata__":
                    continue
                encoded = json.dumps(edited_raw).encode()
                yield path, len(encoded).to_bytes(8, "little") + encoded + blob[8 + size :]


def resealed(blob: bytes) -> bytes:
    size = int.from_bytes(blob[:8], "little")
    raw = json.loads(blob[8 : 8 + size])
    old = json.loads(raw["__metadata__"]["lowbit"]).get("seal_sha256", "")
    start = blob.find(str(old).encode(), 8, 8 + size) if isinstance(old, str) and len(old) == 64 else -1
    if start < 0:
        return blob
    placeholder = blob[:start] + b"?" * 64 + blob[start + 64 :]
    return placeholder[:start] + seal(placeholder, start).encode() + placeholder[start + 64 :]


@pytest.mark.parametrize("name", ["model", "tensors"])
def test_every_header_edit_is_refused(files, name):
    original, count = state_of(files[name]), 0
    for path, blob in header_edits(files[name]):
        assert not loads_same_or_refuses(blob, original), path
        count += 1
    assert count > 100


@pytest.mark.parametrize("name", ["model", "tensors"])
def test_resealed_header_edits_give_a_clear_error_or_a_file(files, name, tmp_path):
    """A forger can recompute SHA-256; the checks behind the seal still stop malformed sizes and entries
    with a SerializationError (no raw exception, no allocation by a forged shape)."""
    target = tmp_path / "forged.safetensors"
    for path, blob in header_edits(files[name]):
        target.write_bytes(resealed(blob))
        try:
            lowbit.load(target, architecture() if name == "model" else None)
        except SerializationError as error:
            assert "forged.safetensors" in str(error) or "entry" in str(error) or "module" in str(error), path


def forged(tensors: dict, metadata: dict | None = None) -> bytes:
    header = {"__metadata__": {"lowbit": json.dumps({"schema": "lowbit.safetensors", "schema_version": 2,
              "kind": "tensors", "seal_sha256": "?" * 64, "entries": {}, "modules": {}})}, **tensors}  # fmt: skip
    encoded = json.dumps(header).encode()
    blob = len(encoded).to_bytes(8, "little") + encoded + bytes(16)
    start = blob.index(b"?" * 64)
    return blob[:start] + seal(blob, start).encode() + blob[start + 64 :]


@pytest.mark.parametrize(("tensors", "message"), [
    ({"x": {"dtype": "F32", "shape": [4], "data_offsets": []}}, "malformed data_offsets"),
    ({"x": {"dtype": "F32", "shape": [20000, 20000], "data_offsets": [0, 16]}}, "1600000000 bytes"),
    ({"x": {"dtype": "F32", "shape": [4], "data_offsets": [0, 1_600_000_000]}}, "1600000000 bytes"),
    ({"x": {"dtype": "F32", "shape": [8], "data_offsets": [0, 32]}}, "truncated"),
    ({"x": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}, "unexpected bytes"),
    ({"x": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
      "y": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}}, "overlaps"),
    ({"x": {"dtype": "F32", "shape": [2], "data_offsets": [8, 16]}}, "gap"),
    ({"x": {"dtype": "Q9", "shape": [4], "data_offsets": [0, 16]}}, "unknown dtype"),
    ({"x": {"dtype": "F32", "shape": [-4], "data_offsets": [0, 16]}}, "malformed shape"),
    ({"x": {"dtype": "F32", "shape": [4.0], "data_offsets": [0, 16]}}, "malformed shape"),
    ({"x": [1, 2]}, "malformed entry"),
])  # fmt: skip
def test_sizes_are_checked_before_allocation(tensors, message):
    with pytest.raises(SerializationError, match=message):
        parse(forged(tensors), "forged.safetensors")


def test_duplicate_keys_and_nan_are_refused():
    good = forged({"x": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}})
    assert parse(good)[1]["x"].shape == (4,)
    size = int.from_bytes(good[:8], "little")
    text = good[8 : 8 + size].decode()
    for bad in (text.replace('"x": {', '"x": {"dtype": "I32", ', 1), text.replace("[4]", "[NaN]")):
        blob = len(bad.encode()).to_bytes(8, "little") + bad.encode() + good[8 + size :]
        with pytest.raises(SerializationError, match="not JSON"):
            parse(blob, "dup.safetensors")


def test_a_truncated_or_foreign_report_json_is_one_clear_error(tmp_path):
    """read_report: every cut of a report.json, and JSON that is not a report, raise ReportError naming the file
    (a JSONDecodeError / KeyError escaped before)."""
    from lowbit.errors import ReportError
    from lowbit.report.files import read_report, to_json

    text = to_json({"schema": "lowbit.report/1", "summary": {"sqnr_db": float("inf")}, "layers": [{"name": "fc"}]})
    path = tmp_path / "report.json"
    path.write_text(text)
    assert read_report(path)["summary"]["sqnr_db"] == float("inf")
    for cut in range(len(text) - 1):  # the last byte is a newline: the file without it is still whole
        path.write_text(text[:cut])
        with pytest.raises(ReportError, match="report.json"):
            read_report(path)
    for foreign in ("[]", '{"layers": []}', "\x80\x81"):
        path.write_bytes(foreign.encode("latin-1"))
        with pytest.raises(ReportError, match="report.json"):
            read_report(path)
