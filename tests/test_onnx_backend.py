"""The onnx package's backend test data through ``tilefuse.compile_onnx``, each case held to its
entry in ``tests/onnx_expectations.json`` (see ``onnx_conformance``: the cases, how one runs, what
passes).  A case whose outcome changes fails: a regression, or an improvement to record with
``python scripts/conformance.py --update [-k CASE]``.
"""
from __future__ import annotations

import math

import pytest

from onnx_conformance import KINDS, cases, check, expectations, key

MIN_PASS_FRACTION = 0.9


@pytest.mark.parametrize("case", cases("test_model_case"))
def test_model_case(case):
    check("test_model_case", case)


@pytest.mark.parametrize("case", cases("test_node_case"))
def test_node_case(case):
    check("test_node_case", case)


# Every node case also runs through the whole pipeline with generated kernels (the optimal plan,
# fused where it pays): a sample of every NODE_SAMPLE-th case by default, all with --runslow
# (about 6 minutes on 2 cores).  The expectations file holds every case, so both modes are checked.
NODE_SAMPLE = 12


def pytest_generate_tests(metafunc):
    if metafunc.function.__name__ == "test_node_case_through_kernels":
        names = cases("test_node_case_through_kernels")
        if not metafunc.config.getoption("--runslow"):
            names = names[::NODE_SAMPLE]
        metafunc.parametrize("case", names)


def test_node_case_through_kernels(case):
    check("test_node_case_through_kernels", case)


def test_expectations_cover_every_case():
    """One entry per case of every kind, and none for a case that no longer exists."""
    want = {key(kind, case) for kind in KINDS for case in cases(kind)}
    have = set(expectations())
    assert not want - have and not have - want, (
        f"missing: {sorted(want - have)[:10]}, stale: {sorted(have - want)[:10]}; "
        "run python scripts/conformance.py --update")
    bad = {k: v for k, v in expectations().items() if v != "pass" and not v.startswith(("unsupported: ", "skip: "))}
    assert not bad, f"entries must be pass, unsupported: <reason> or skip: <reason>: {bad}"


def test_model_cases_mostly_pass():
    """At least 90% of the model cases compile and match (unsupported ones count as not passing):
    counted on their entries, to which each case's own test above holds it (so the pipeline runs
    once per case, in whichever process runs that case)."""
    ids = cases("test_model_case")
    assert len(ids) >= 100, f"only {len(ids)} model cases found"
    entries = {case: str(expectations().get(key("test_model_case", case))) for case in ids}
    failed = {case: v for case, v in entries.items() if v != "pass"}
    need = math.ceil(MIN_PASS_FRACTION * len(ids))
    passed = len(ids) - len(failed)
    assert passed >= need, (f"{passed}/{len(ids)} model cases pass, need {need}:\n"
                            + "\n".join(f"  {k}: {v[:160]}" for k, v in sorted(failed.items())))


@pytest.mark.parametrize("entry", ["unsupported: Abs: no fission rule for this operator type", "pass?", None])
def test_an_outcome_other_than_its_entry_fails_naming_the_update(monkeypatch, entry):
    """A case that now passes, changed, or has no entry fails (test_abs passes today)."""
    import onnx_conformance
    table = {} if entry is None else {key("test_node_case", "test_abs"): entry}
    monkeypatch.setattr(onnx_conformance, "expectations", lambda: table)
    with pytest.raises(pytest.fail.Exception, match=r"scripts/conformance.py --update -k 'test_abs'"):
        check("test_node_case", "test_abs")
