"""lowbit.native.interface mirrors csrc/: every entry point's ctypes signature, every numbered choice and every
structure is read here from the C definitions themselves, so that a change on one side alone fails, naming what
differs. Needs no compiler and no library."""

from __future__ import annotations

import ast
import ctypes
import re
from pathlib import Path

import pytest

from lowbit.native import interface

CSRC = Path(interface.__file__).parent / "csrc"
_C_TYPES = {"int": ctypes.c_int, "int32_t": ctypes.c_int32, "int64_t": ctypes.c_int64, "float": ctypes.c_float,
            "double": ctypes.c_double}  # fmt: skip
_DEFINITION = re.compile(r"^(\w+)\s+(lb_\w+)\s*\(([^)]*)\)\s*\{", re.M)  # exported: not static, at column 0
_ENUM = re.compile(r"\benum\b\s*\w*\s*\{([^}]*)\}")
_STRUCT = re.compile(r"typedef\s+struct\s*\w*\s*\{([^}]*)\}\s*(\w+)\s*;")


def _code(path: Path) -> str:
    """The C text of ``path`` without its comments."""
    text = re.sub(r"/\*.*?\*/", " ", path.read_text(), flags=re.S)
    return re.sub(r"//[^\n]*", " ", text)


def _ctype(declaration: str):
    """The ctypes type a C declaration passes as: any pointer an address, else its scalar type (None: void)."""
    if "*" in declaration:
        return ctypes.c_void_p
    words = [word for word in declaration.split() if word not in ("const", "volatile", "restrict")]
    if words == ["void"]:
        return None
    return _C_TYPES.get(words[0], words[0])  # an unknown type stays a string: it matches no ctypes type


def _definitions() -> dict[str, list[tuple]]:
    """Every exported lb_* function defined in csrc/*.c: name -> [(result type, argument types, file)]."""
    found: dict[str, list[tuple]] = {}
    for path in sorted(CSRC.glob("*.c")):
        for match in _DEFINITION.finditer(_code(path)):
            result, name, parameters = match.groups()
            listed = [] if parameters.strip() in ("", "void") else parameters.split(",")
            arguments = tuple(_ctype(parameter) for parameter in listed)
            found.setdefault(name, []).append((_ctype(result), arguments, path.name))
    return found


def _enum_constants(path: Path) -> dict[str, int]:
    """Every enum constant of one C file with its value (implicit values count up from the last one)."""
    constants: dict[str, int] = {}
    for body in _ENUM.findall(_code(path)):
        value = -1
        for item in filter(None, (part.strip() for part in body.split(","))):
            name, _, given = (part.strip() for part in item.partition("="))
            value = int(given, 0) if given else value + 1
            constants[name] = value
    return constants


def _struct_fields(path: Path, name: str) -> list[tuple[str, object]]:
    """The fields of ``typedef struct {...} name;`` in one C file, in order, as (name, ctypes type)."""
    for body, typedef in _STRUCT.findall(_code(path)):
        if typedef == name:
            return [field for line in body.split(";") if line.strip() for field in _declared(line)]
    raise AssertionError(f"{path.name} defines no typedef struct {name}")


def _declared(line: str) -> list[tuple[str, object]]:
    """``float a, *b`` -> [("a", c_float), ("b", c_void_p)]."""
    words = line.replace("*", " * ").split()
    start = next(index for index, word in enumerate(words) if word not in ("const", "volatile"))
    base, rest = words[start], " ".join(words[start + 1 :])
    fields = []
    for declarator in rest.split(","):
        pointer = "*" in declarator
        fields.append((declarator.replace("*", "").strip(), ctypes.c_void_p if pointer else _C_TYPES[base]))
    return fields


def _named(types) -> list[str]:
    return ["void" if kind is None else getattr(kind, "__name__", str(kind)) for kind in types]


@pytest.mark.parametrize("name", sorted(interface.ENTRY_POINTS))
def test_entry_point_matches_its_c_definition(name):
    definitions = _definitions().get(name)
    assert definitions, f"{name} is in interface.ENTRY_POINTS but no csrc/*.c file exports it"
    assert len(definitions) == 1, f"{name} is defined {len(definitions)} times: {[d[2] for d in definitions]}"
    result, arguments, file = definitions[0]
    want_result, want_arguments = interface.ENTRY_POINTS[name]
    assert result is want_result, (
        f"{name} ({file}) returns {_named([result])[0]}, interface.ENTRY_POINTS says {_named([want_result])[0]}"
    )
    assert arguments == tuple(want_arguments), (
        f"{name} ({file}) takes {_named(arguments)}, interface.ENTRY_POINTS says {_named(want_arguments)}"
    )


@pytest.mark.parametrize("table", sorted(interface.ENUM_SOURCES))
def test_numbered_choices_match_their_c_enum(table):
    file, prefix = interface.ENUM_SOURCES[table]
    constants = _enum_constants(CSRC / file)
    for key, code in getattr(interface, table).items():
        constant = prefix + key.upper()
        assert constant in constants, f"interface.{table}[{key!r}]: {file} declares no enum constant {constant}"
        assert constants[constant] == code, (
            f"interface.{table}[{key!r}] = {code}, but {file} numbers {constant} = {constants[constant]}"
        )
    extra = sorted(name for name in constants if name.startswith(prefix) and name[len(prefix) :].lower()
                   not in getattr(interface, table))  # fmt: skip
    if table not in ("ROUNDING_CODES", "WEIGHT_KINDS", "STORAGE_CODES"):  # their prefixes are shared in their files
        assert not extra, f"{file} declares {extra}, which interface.{table} lacks"


@pytest.mark.parametrize("structure", list(interface.STRUCT_SOURCES), ids=lambda s: s.__name__)
def test_structure_matches_its_c_typedef(structure):
    file, typedef = interface.STRUCT_SOURCES[structure]
    want = _struct_fields(CSRC / file, typedef)
    assert [(name, kind) for name, kind in structure._fields_] == want, (
        f"interface.{structure.__name__} fields {structure._fields_} differ from {file}'s {typedef}: {want}"
    )


def test_every_bound_name_is_in_the_table():
    """Each entry point the native modules name (``kernels.function("lb_...")``, a setter passed on) has its row
    in the table: ``function`` would raise KeyError only when that path first runs."""
    missing = set()
    for path in sorted(CSRC.parent.glob("*.py")):
        if path.name == "interface.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and re.fullmatch(r"lb_\w+", node.value):
                if node.value not in interface.ENTRY_POINTS:
                    missing.add(f"{path.name}: {node.value}")
    assert not missing, f"entry points named without a row in interface.ENTRY_POINTS: {sorted(missing)}"


def test_the_parser_sees_a_drift():
    """The checks above would notice: a changed argument type and a renumbered constant."""
    result, arguments = interface.ENTRY_POINTS["lb_mx_f32"]
    assert _definitions()["lb_mx_f32"][0][1] != arguments[:-1] + (ctypes.c_int64,)
    assert _enum_constants(CSRC / "block_scaled.c")["LB_SCALE_RULE_EVEN"] == 2
