"""ONNX conformance: run the onnx package's backend cases through tilefuse and print the pass rates.

    python scripts/conformance.py                   # every case of every kind, pass rates (minutes)
    python scripts/conformance.py --update          # ... and rewrite tests/onnx_expectations.json
    python scripts/conformance.py --update -k Gelu  # rerun the cases whose id contains Gelu, merge
    python scripts/conformance.py --json out.json   # outcomes and rates as JSON ('-': stdout)

Kinds (``--kinds``): ``test_node_case`` (frontend + fission, the reference executor),
``test_node_case_through_kernels`` (the whole pipeline, generated kernels, optimal strategy),
``test_model_case`` (the model cases, likewise), ``test_canonical_graph_matches_onnxruntime`` (the
frontend's graph run by onnxruntime).  The cases and outcomes are ``tests/onnx_conformance.py``'s.
A wrong answer (``fail: ...``) is never written to the file: its old entry stays, so the test keeps
failing, and the script exits with status 1.
"""
from __future__ import annotations

import argparse
import collections
import datetime
import json
import os
import platform
import re
import sys
import time
import warnings

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests"))

import onnx_conformance as oc  # noqa: E402

SHORT = {"test_node_case": "node cases, reference executor",
         "test_node_case_through_kernels": "node cases, generated kernels (optimal)",
         "test_model_case": "model cases, generated kernels (optimal)",
         "test_canonical_graph_matches_onnxruntime": "canonical graph run by onnxruntime"}


def run(kinds, pattern: str | None, progress: bool) -> dict[str, dict[str, str]]:
    """{kind: {case: outcome}}; a wrong answer or crash is 'fail: <first line>'."""
    got = {}
    for kind in kinds:
        todo = [c for c in oc.cases(kind) if not pattern or pattern in c]
        got[kind] = {}
        t0 = time.time()
        for k, case in enumerate(todo):
            try:
                got[kind][case] = oc.outcome_of(kind, case)
            except Exception as e:  # noqa: BLE001 - every failure is reported, none stops the run
                got[kind][case] = f"fail: {type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"
            if progress and (k + 1) % 100 == 0:
                print(f"  {kind}: {k + 1}/{len(todo)} ({time.time() - t0:.0f} s)", file=sys.stderr)
    return got


def _status(outcome: str) -> str:
    return outcome.split(":", 1)[0]


def rates(got: dict[str, dict[str, str]]) -> dict[str, dict[str, int]]:
    return {kind: dict(collections.Counter(_status(o) for o in outcomes.values())) for kind, outcomes in got.items()}


def operator_of(case: str) -> str:
    """The operator a node case tests: its one op type, or its unexpanded twin's."""
    cases = oc._node_cases()
    ops = {nd.op_type for nd in cases[case].model.graph.node} - {"Constant"}
    if len(ops) == 1:
        return ops.pop()
    twin = re.sub(r"_expanded.*$", "", case)
    return operator_of(twin) if twin != case and twin in cases else "(several)"


def _reason_op(outcome: str) -> str:
    """The operator an unsupported reason names."""
    m = re.match(r"unsupported: (?:unsupported attribute \S+ of )?(\w+)", outcome)
    return m.group(1) if m else "?"


def per_operator(outcomes: dict[str, str]) -> dict[str, dict]:
    """Node cases by operator: counts per status, and the unsupported reasons."""
    table: dict[str, dict] = {}
    for case, o in outcomes.items():
        row = table.setdefault(operator_of(case), {"cases": 0, "pass": 0, "unsupported": 0, "skip": 0, "fail": 0,
                                                    "reasons": collections.Counter()})
        row["cases"] += 1
        row[_status(o)] += 1
        if o.startswith(("unsupported: ", "fail: ")):
            row["reasons"][o] += 1
    return {op: {**r, "reasons": dict(r["reasons"].most_common())} for op, r in sorted(table.items())}


def unsupported_by_operator(outcomes: dict[str, str]) -> dict[str, int]:
    """How many cases each operator named in an unsupported reason stops."""
    return dict(collections.Counter(_reason_op(o) for o in outcomes.values() if o.startswith("unsupported: "))
                .most_common())


def update(got: dict[str, dict[str, str]], pattern: str | None) -> list[str]:
    """Write the outcomes into the expectations file; returns the keys left as they were (failures).
    A full run of a kind replaces its entries (cases gone from onnx drop out); with a pattern the
    rerun cases are merged into the file."""
    old = oc.expectations() if os.path.exists(oc.EXPECTATIONS) else {}
    replaced = () if pattern else tuple(f"{kind}[" for kind in got)
    table = {k: v for k, v in old.items() if not k.startswith(replaced)}
    kept = []
    for kind, outcomes in got.items():
        for case, o in outcomes.items():
            k = oc.key(kind, case)
            if not o.startswith("fail: "):
                table[k] = o
            elif k in old:
                table[k] = old[k]
                kept.append(k)
    oc.save_expectations(table)
    return kept


def _pct(c: dict[str, int]) -> str:
    n = sum(c.values())
    run = n - c.get("skip", 0)
    return (f"{c.get('pass', 0)}/{run} pass ({100 * c.get('pass', 0) / max(run, 1):.1f}% of the cases run; "
            f"{c.get('unsupported', 0)} unsupported, {c.get('fail', 0)} failing, {c.get('skip', 0)} skipped)")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--kinds", default=",".join(oc.KINDS), help="comma-separated kinds (default: all)")
    ap.add_argument("-k", dest="pattern", help="only the cases whose id contains this string")
    ap.add_argument("--update", action="store_true", help="write the outcomes to tests/onnx_expectations.json")
    ap.add_argument("--json", help="write outcomes, rates and per-operator tables to this file ('-': stdout)")
    ap.add_argument("--quiet", action="store_true", help="no progress lines")
    args = ap.parse_args()
    kinds = [k for k in args.kinds.split(",") if k]
    unknown = set(kinds) - set(oc.KINDS)
    if unknown:
        ap.error(f"unknown kinds {sorted(unknown)}; choose from {', '.join(oc.KINDS)}")
    warnings.simplefilter("ignore")
    t0 = time.time()
    got = run(kinds, args.pattern, not args.quiet)
    elapsed = time.time() - t0
    counts = rates(got)
    report = {"date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
              "machine": f"{platform.machine()}, {os.cpu_count()} cores, {platform.python_version()}",
              "seconds": round(elapsed), "rates": counts, "outcomes": got}
    for kind in ("test_node_case", "test_node_case_through_kernels"):
        if kind in got:
            report[f"{kind}_by_operator"] = per_operator(got[kind])
            report[f"{kind}_unsupported_by_operator"] = unsupported_by_operator(got[kind])
    out = sys.stderr if args.json == "-" else sys.stdout
    for kind in kinds:
        print(f"{SHORT[kind]}: {_pct(counts[kind])}", file=out)
    for kind in ("test_node_case", "test_node_case_through_kernels"):
        if kind in got and not args.pattern:
            top = list(report[f"{kind}_unsupported_by_operator"].items())
            print(f"{SHORT[kind]}, unsupported by operator: " + ", ".join(f"{op} {n}" for op, n in top), file=out)
    fails = [(kind, c, o) for kind, outs in got.items() for c, o in outs.items() if o.startswith("fail: ")]
    for kind, c, o in fails:
        print(f"FAIL {oc.key(kind, c)}: {o}", file=out)
    print(f"({elapsed:.0f} s)", file=out)
    if args.json:
        text = json.dumps(report, indent=1, sort_keys=True)
        if args.json == "-":
            print(text)
        else:
            with open(args.json, "w") as f:
                f.write(text + "\n")
    if args.update:
        kept = update(got, args.pattern)
        print(f"wrote {os.path.relpath(oc.EXPECTATIONS, ROOT)}"
              + (f"; {len(kept)} failing cases kept their old entries" if kept else ""), file=out)
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
