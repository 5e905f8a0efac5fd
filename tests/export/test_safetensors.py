"""lowbit.save / lowbit.load: exact round trips, the header schema, modules, and clear errors for bad files."""

from __future__ import annotations

import json
import pickle

import pytest
import torch
from format_cases import CASE_IDS, CASES
from torch import nn

import lowbit
from lowbit.export import SerializationError

pytest.importorskip("safetensors")
from lowbit.export.safetensors_io import SCHEMA_VERSION, read_file, seal
from lowbit.qtensor import QTensor


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.dtype != b.dtype or a.shape != b.shape or not torch.equal(a.isnan(), b.isnan()):
        return False
    a, b = a.masked_fill(a.isnan(), 0), b.masked_fill(b.isnan(), 0)
    return torch.equal(a, b) and torch.equal(torch.signbit(a), torch.signbit(b))


def data(shape=(6, 40), seed=0, dtype=torch.float32) -> torch.Tensor:
    return (torch.randn(shape, generator=torch.Generator().manual_seed(seed)) * 2).to(dtype)


def raw_header(path) -> dict:
    size = int.from_bytes(path.read_bytes()[:8], "little")
    return json.loads(path.read_bytes()[8 : 8 + size])


def rewrite_header(path, change, reseal=True) -> None:
    """Apply ``change`` to the lowbit header and rewrite the file around the same tensor data; ``reseal``:
    seal it again (as a deliberate forger could), so the checks behind the seal are reached."""
    blob = path.read_bytes()
    size = int.from_bytes(blob[:8], "little")
    raw = json.loads(blob[8 : 8 + size])
    header = json.loads(raw["__metadata__"]["lowbit"])
    change(header)
    raw["__metadata__"]["lowbit"] = json.dumps(header)
    encoded = json.dumps(raw).encode()
    encoded += b" " * (-len(encoded) % 8)
    blob = len(encoded).to_bytes(8, "little") + encoded + blob[8 + size :]
    if reseal:
        blob = resealed(blob, header["seal_sha256"])
    path.write_bytes(blob)


def resealed(blob: bytes, old_seal: str) -> bytes:
    start = blob.index(old_seal.encode())
    placeholder = blob[:start] + b"?" * 64 + blob[start + 64 :]
    return placeholder[:start] + seal(placeholder, start).encode() + placeholder[start + 64 :]


@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_round_trip_of_every_format(tmp_path, case):
    _, name, params, _ = case
    x = data(seed=len(name))
    q = lowbit.encode(x, name, **params)
    lowbit.save({"w": q, "plain": x}, tmp_path / "t.safetensors")
    back = lowbit.load(tmp_path / "t.safetensors")
    assert isinstance(back["w"], QTensor) and back["w"].spec == q.spec
    assert torch.equal(back["w"].codes, q.codes) and back["w"].block == q.block
    assert same_bits(back["w"].dequantize(), lowbit.quantize(x, name, **params))
    assert same_bits(back["plain"], x)


@pytest.mark.parametrize("storage", ["native", "uint8", "uint32"])
@pytest.mark.parametrize(("name", "params"), [("q4s", {"block_size": [1, 16], "scale_dtype": "bf16"}),
                                              ("affine", {"bits": 3, "axis": 0}), ("mxfp6_e3m2", {}),
                                              ("integer", {"width": 5, "frac_width": 2})])  # fmt: skip
def test_every_packing_round_trips(tmp_path, storage, name, params):
    x = data((5, 37), 3, torch.bfloat16)
    q = lowbit.encode(x, name, storage=storage, **params)
    lowbit.save({"w": q}, tmp_path / "p.safetensors")
    back = lowbit.load(tmp_path / "p.safetensors")["w"]
    assert back.layout == storage and same_bits(back.dequantize(), lowbit.quantize(x, name, **params))
    if q.zero_sign is not None:
        assert torch.equal(back.zero_sign, q.zero_sign)


def test_packed_storage_is_small(tmp_path):
    x = data((256, 256))
    lowbit.save({"w": lowbit.encode(x, "q4s", block_size=[1, 32], scale_dtype="f16")}, tmp_path / "q.safetensors")
    lowbit.save({"w": x}, tmp_path / "f.safetensors")
    small, large = (tmp_path / "q.safetensors").stat().st_size, (tmp_path / "f.safetensors").stat().st_size
    assert small < large * 0.16  # 4.5 bits of 32, plus the header


def test_header_schema_fields(tmp_path):
    q = lowbit.encode(data(), "q4f", block_size=[2, 8], scale_dtype="f16")
    lowbit.save({"layer.weight": q, "layer.bias": torch.zeros(3)}, tmp_path / "h.safetensors")
    raw = raw_header(tmp_path / "h.safetensors")
    header = json.loads(raw["__metadata__"]["lowbit"])
    assert header["schema"] == "lowbit.safetensors" and header["schema_version"] == SCHEMA_VERSION
    assert header["kind"] == "tensors" and len(header["seal_sha256"]) == 64 and header["modules"] == {}
    entry = header["entries"]["layer.weight"]
    assert entry["type"] == "qtensor" and entry["prefix"] == "layer.weight#"
    assert entry["format"] == {"name": "q4f", "params": q.spec.params() | {"block_size": [2, 8]}}
    assert entry["codes"] == {"key": "codes", "bits": 4, "signed": True, "packing": "uint8", "padding_bits": 0}
    assert entry["block"] == [2, 8] and entry["shape"] == [6, 40] and entry["dtype"] == "float32"
    assert entry["params"]["scale"] == {"key": "params.scale", "dtype": "float16", "shape": [3, 5]}
    assert raw["layer.weight#codes"]["dtype"] == "U8" and raw["layer.weight#params.scale"]["dtype"] == "F16"
    assert header["entries"]["layer.bias"] == {"type": "tensor", "key": "layer.bias"}


def test_loading_needs_no_pickle(tmp_path, monkeypatch):
    lowbit.save({"w": lowbit.encode(data(), "e4m3", block_size=[1, 8])}, tmp_path / "n.safetensors")

    def forbidden(*args, **kwargs):
        raise AssertionError("pickle used")

    for module, name in ((pickle, "load"), (pickle, "loads"), (pickle, "Unpickler"), (torch, "load")):
        monkeypatch.setattr(module, name, forbidden)
    assert isinstance(lowbit.load(tmp_path / "n.safetensors")["w"], QTensor)


# ---- bad files ----------------------------------------------------------------------------------------------
@pytest.fixture
def saved(tmp_path):
    path = tmp_path / "good.safetensors"
    lowbit.save({"w": lowbit.encode(data(), "q4s", axis=0), "b": torch.ones(4)}, path)
    return path


@pytest.mark.parametrize("keep", [0, 5, 8, 40, -1, -7])
def test_truncated_file(saved, keep):
    blob = saved.read_bytes()
    saved.write_bytes(blob[: keep if keep >= 0 else len(blob) + keep])
    with pytest.raises(SerializationError, match="truncated"):
        lowbit.load(saved)


def test_flipped_data_byte_fails_the_checksum(saved):
    blob = bytearray(saved.read_bytes())
    blob[-3] ^= 0x10
    saved.write_bytes(bytes(blob))
    with pytest.raises(SerializationError, match="checksum"):
        lowbit.load(saved)


def test_garbage_and_foreign_files(tmp_path):
    (tmp_path / "g.bin").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json!!}    " + b"\x00" * 8)
    with pytest.raises(SerializationError, match="not JSON"):
        lowbit.load(tmp_path / "g.bin")
    from safetensors.torch import save_file

    save_file({"x": torch.ones(2)}, str(tmp_path / "plain.safetensors"))
    with pytest.raises(SerializationError, match="without a lowbit header"):
        lowbit.load(tmp_path / "plain.safetensors")
    with pytest.raises(SerializationError, match="cannot read"):
        lowbit.load(tmp_path / "missing.safetensors")


def test_trailing_bytes_are_rejected(saved):
    saved.write_bytes(saved.read_bytes() + b"xx")
    with pytest.raises(SerializationError, match="unexpected bytes"):
        lowbit.load(saved)


@pytest.mark.parametrize(("change", "message"), [
    (lambda h: h.update(schema_version=3), "schema version 3; this lowbit .* reads version 2"),
    (lambda h: h.update(schema_version=1), "earlier lowbit .*schema 1.* Save the model again"),
    (lambda h: h.update(schema="other"), "does not declare schema"),
    (lambda h: h.pop("entries"), "incomplete"),
    (lambda h: h["entries"]["w"].update(prefix="v#"), "tensor 'v#codes' is missing"),
    (lambda h: h["entries"].update(c={"type": "tensor", "key": "c"}), "tensor 'c' is missing"),
    (lambda h: h["entries"]["w"]["params"]["scale"].update(shape=[7, 1]), "does not match the header"),
    (lambda h: h["entries"]["w"].update(shape=[6, 41]), "malformed"),
    (lambda h: h["entries"]["w"]["codes"].update(bits=8), "malformed"),
    (lambda h: h["entries"]["w"]["format"].update(name="q4z"), "unknown format 'q4z'"),
    (lambda h: h["entries"]["w"].update(type="pickle"), "unknown type"),
])  # fmt: skip
def test_tampered_header(saved, change, message):
    rewrite_header(saved, change)
    with pytest.raises(SerializationError, match=message):
        lowbit.load(saved)


@pytest.mark.parametrize("change", [
    lambda h: h.update(seal_sha256="0" * 64),
    lambda h: h.update(seal_sha256="?" * 64),
    lambda h: h["entries"]["w"]["format"]["params"].update(bits=3),
    lambda h: h.update(kind="module"),
    lambda h: h.update(lowbit_version="0.0.0"),
    lambda h: None,  # same header, only its JSON spacing changed
])  # fmt: skip
def test_header_edits_break_the_seal(saved, change):
    rewrite_header(saved, change, reseal=False)
    with pytest.raises(SerializationError, match="checksum"):
        lowbit.load(saved)


def test_errors_are_lowbit_errors_not_safetensors_errors(saved):
    saved.write_bytes(saved.read_bytes()[:50])
    with pytest.raises(lowbit.LowbitError):
        read_file(saved)


def test_unsavable_objects(tmp_path):
    with pytest.raises(SerializationError, match="no pickle"):
        lowbit.save({"w": [1, 2]}, tmp_path / "x.safetensors")
    with pytest.raises(SerializationError, match="reserve"):
        lowbit.save({"a#b": torch.ones(1)}, tmp_path / "x.safetensors")
    with pytest.raises(SerializationError, match="dict of tensors or an nn.Module"):
        lowbit.save(torch.ones(2), tmp_path / "x.safetensors")
    assert not list(tmp_path.iterdir())  # nothing half-written


def test_overwrite_is_atomic_and_leaves_no_temporary_files(tmp_path):
    path = tmp_path / "a.safetensors"
    lowbit.save({"x": torch.ones(3)}, path)
    lowbit.save({"x": torch.zeros(5)}, path)
    assert torch.equal(lowbit.load(path)["x"], torch.zeros(5))
    assert [p.name for p in tmp_path.iterdir()] == ["a.safetensors"]


# ---- modules ------------------------------------------------------------------------------------------------
class TinyRealLinear(nn.Module):
    """A minimal real-quantized Linear honouring the REAL_MODULES contract: config() / from_config()."""

    def __init__(self, in_features: int, out_features: int, bits: int = 4) -> None:
        super().__init__()
        self.in_features, self.out_features, self.bits = in_features, out_features, bits
        self.register_buffer("codes", torch.zeros(out_features, in_features, dtype=torch.int8))
        self.register_buffer("scale", torch.ones(out_features, 1))
        self.bias = nn.Parameter(torch.zeros(out_features))

    @classmethod
    def from_linear(cls, linear: nn.Linear, bits: int = 4) -> TinyRealLinear:
        module = cls(linear.in_features, linear.out_features, bits)
        q = lowbit.encode(linear.weight.detach(), "affine", bits=bits, symmetric=True, axis=0)
        module.codes.copy_(q.codes)
        module.scale.copy_(q.params["scale"])
        module.bias.data.copy_(linear.bias.detach())
        return module

    def config(self) -> dict:
        return {"in_features": self.in_features, "out_features": self.out_features, "bits": self.bits}

    @classmethod
    def from_config(cls, config: dict) -> TinyRealLinear:
        return cls(**config)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return nn.functional.linear(x, self.codes.float() * self.scale, self.bias)


def float_model(seed: int = 0) -> nn.Sequential:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Sequential(nn.Linear(16, 4)))


def real_model() -> nn.Sequential:
    model = float_model()
    model[0] = TinyRealLinear.from_linear(model[0])
    model[2][0] = TinyRealLinear.from_linear(model[2][0], bits=3)
    return model


def test_module_round_trip_swaps_real_modules_in(tmp_path):
    model, x = real_model(), torch.randn(5, 8)
    lowbit.save(model, tmp_path / "m.safetensors", modules=[TinyRealLinear])
    header = json.loads(raw_header(tmp_path / "m.safetensors")["__metadata__"]["lowbit"])
    assert header["kind"] == "module"
    assert header["modules"] == {
        "0": {"class": "TinyRealLinear", "config": {"in_features": 8, "out_features": 16, "bits": 4}},
        "2.0": {"class": "TinyRealLinear", "config": {"in_features": 16, "out_features": 4, "bits": 3}},
    }
    registry = {"TinyRealLinear": TinyRealLinear}
    loaded = lowbit.load(tmp_path / "m.safetensors", model=float_model(seed=1), modules=registry)
    assert isinstance(loaded[0], TinyRealLinear) and isinstance(loaded[2][0], TinyRealLinear)
    assert loaded[2][0].bits == 3 and torch.equal(loaded(x), model(x))
    state = lowbit.load(tmp_path / "m.safetensors")
    assert set(state) == set(model.state_dict()) and state["0.codes"].dtype == torch.int8


def test_module_load_errors(tmp_path):
    lowbit.save(real_model(), tmp_path / "m.safetensors", modules=[TinyRealLinear])
    with pytest.raises(SerializationError, match="unknown real-quantized class"):
        lowbit.load(tmp_path / "m.safetensors", model=float_model())
    other = nn.Sequential(nn.Linear(8, 16))
    with pytest.raises(SerializationError, match="does not exist in the given model"):
        lowbit.load(tmp_path / "m.safetensors", model=other, modules=[TinyRealLinear])
    wide = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Sequential(nn.Linear(16, 4)), nn.Linear(4, 2))
    with pytest.raises(SerializationError, match="does not fit the model"):
        lowbit.load(tmp_path / "m.safetensors", model=wide, modules=[TinyRealLinear])


def test_fake_quantized_model_state_round_trips(tmp_path):
    from lowbit.nn import QuantLinear, RoleFormats

    layer = QuantLinear.from_float(nn.Linear(6, 3), RoleFormats(weight=lowbit.formats.resolve("q8s")))
    model = nn.Sequential(layer, nn.Linear(3, 3))
    model[1].weight = model[0].weight.__class__(torch.randn(3, 3))
    lowbit.save(model, tmp_path / "f.safetensors")
    fresh = nn.Sequential(QuantLinear.from_float(nn.Linear(6, 3), layer.formats), nn.Linear(3, 3))
    lowbit.load(tmp_path / "f.safetensors", model=fresh)
    x = torch.randn(2, 6)
    assert torch.equal(fresh(x), model(x))


def test_registry_of_lowbit_ops_is_used():
    from lowbit.export.safetensors_io import real_module_classes

    ops = pytest.importorskip("lowbit.ops", reason="lowbit.ops (the operators half of issue 8) is not present")
    REAL_MODULES = ops.REAL_MODULES  # noqa: N806

    assert set(REAL_MODULES) <= set(real_module_classes())


def test_empty_tensors_and_empty_files_round_trip(tmp_path):
    tensors = {"e": torch.zeros(0), "x": torch.ones(2), "f": torch.zeros(0, 3, dtype=torch.int8),
               "b": torch.tensor([True])}  # fmt: skip
    lowbit.save(tensors, tmp_path / "e.safetensors")
    back = lowbit.load(tmp_path / "e.safetensors")
    assert back.keys() == tensors.keys() and all(same_bits(back[k].float(), tensors[k].float()) for k in tensors)
    assert all(back[k].dtype == tensors[k].dtype and back[k].shape == tensors[k].shape for k in tensors)
    lowbit.save({}, tmp_path / "none.safetensors")
    assert lowbit.load(tmp_path / "none.safetensors") == {}


def _tied_llama():
    import copy

    import transformers

    torch.manual_seed(0)
    config = transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                                      num_key_value_heads=2, vocab_size=128, tie_word_embeddings=True)  # fmt: skip
    model = transformers.LlamaForCausalLM(config).eval()
    with torch.no_grad():
        model.model.norm.weight.uniform_(0.5, 1.5)  # folded into lm_head by the rotation: the two then differ
    return model, copy.deepcopy(model)


def test_a_model_saved_after_its_tie_was_broken_loads_as_saved(tmp_path):
    model, fresh = _tied_llama()
    lowbit.quantize_(model, "rotate")  # unties lm_head from embed_tokens
    ids = torch.randint(0, 128, (1, 12), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        expected = model(ids).logits
    lowbit.save(model, tmp_path / "rotated.safetensors")
    with pytest.warns(UserWarning, match="untied in the model"):
        loaded = lowbit.load(tmp_path / "rotated.safetensors", model=fresh)
    assert loaded.lm_head.weight is not loaded.model.embed_tokens.weight and not loaded.config.tie_word_embeddings
    with torch.no_grad():
        assert torch.equal(loaded(ids).logits, expected)


def test_a_tie_the_file_keeps_stays_tied(tmp_path, recwarn):
    model, fresh = _tied_llama()
    lowbit.save(model, tmp_path / "tied.safetensors")
    loaded = lowbit.load(tmp_path / "tied.safetensors", model=fresh)
    assert loaded.lm_head.weight is loaded.model.embed_tokens.weight
    assert not [warning for warning in recwarn if "untied" in str(warning.message)]


@pytest.mark.parametrize("recipe", [None, "int8_dynamic"])
def test_a_rotated_model_with_online_hadamards_saves_and_loads(tmp_path, recipe):
    from lowbit.export.records import module_records, real_module_classes

    model, fresh = _tied_llama()
    lowbit.quantize_(model, "rotate", online_down=True)
    if recipe is not None:
        lowbit.quantize_(model, recipe)
    records = module_records(model, real_module_classes())
    assert records["model.layers.0.mlp"] == {"kind": "structure", "class": "HadamardGatedMLP"}
    assert "model.layers.0.mlp.hadamard" not in records
    ids = torch.randint(0, 128, (1, 12), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        expected = model(ids).logits
    lowbit.save(model, tmp_path / "rotated.safetensors")
    import contextlib

    # float: lm_head's own weight is untied in the fresh model; int8: lm_head is a real module with its codes
    untie = pytest.warns(UserWarning, match="untied") if recipe is None else contextlib.nullcontext()
    with untie:
        loaded = lowbit.load(tmp_path / "rotated.safetensors", model=fresh)
    assert type(loaded.model.layers[1].mlp).__name__ == "HadamardGatedMLP"
    with torch.no_grad():
        assert torch.equal(loaded(ids).logits, expected)


def test_an_unknown_structure_record_is_one_clear_error():
    from lowbit.export.records import rebuild_modules

    model, _ = _tied_llama()
    with pytest.raises(SerializationError, match="unknown structure record"):
        rebuild_modules(model, {"model.layers.0.mlp": {"kind": "structure", "class": "Nope"}}, {})
