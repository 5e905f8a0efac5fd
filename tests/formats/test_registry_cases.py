"""tests/format_cases.py and the registry must agree, so the generic suite covers every format."""

from __future__ import annotations

import lowbit
from format_cases import CASE_IDS, CASES


def case_names() -> set[str]:
    return {name for _, name, _, _ in CASES}


def test_every_registered_format_has_a_case():
    # Aliases count as their format: a case naming the canonical name (or any alias) covers all of them.
    covered = {lowbit.get_format(name).format_name for name in case_names() if name in lowbit.list_formats()}
    missing = sorted(
        name for name in lowbit.list_formats() if lowbit.get_format(name).format_name not in covered
    )
    assert not missing, f"registered formats with no case in tests/format_cases.py: {missing}"


def test_every_case_names_a_registered_format():
    unknown = sorted(case_names() - set(lowbit.list_formats()))
    assert not unknown, f"tests/format_cases.py names formats that are not registered: {unknown}"


def test_every_case_builds_and_ids_are_unique():
    assert len(CASE_IDS) == len(set(CASE_IDS))
    known_traits = {"sign_symmetric", "deterministic", "scalar", "asymmetric_minmax", "nan_left_out",
                    "scale_recomputed", "searched"}
    for case_id, name, params, traits in CASES:
        assert traits <= known_traits, (case_id, traits - known_traits)
        if name in lowbit.list_formats():
            spec = lowbit.get_format(name).create(**params)
            assert spec.format_name == lowbit.get_format(name).format_name, case_id
