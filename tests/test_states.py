"""Execution states and convex sets (Korch Algorithm 1, Theorem 1; notes §7 tests 4 and 5)."""
import pytest

from tilefuse.orchestrate.states import TooManyStates, bits, convex_sets, execution_states, is_convex, successors


def preds_of(names: str, edges: list[str]) -> list[int]:
    """Predecessor bitsets for nodes named by single letters (in topological order) and 'ab' edges."""
    pos = {c: k for k, c in enumerate(names)}
    preds = [0] * len(names)
    for u, v in edges:
        preds[pos[v]] |= 1 << pos[u]
    return preds


def mask(names: str, members: str) -> int:
    return sum(1 << names.index(c) for c in members)


def descendants(succs: list[int]) -> list[int]:
    """For each node, the bitset of nodes reachable from it (itself excluded)."""
    desc = [0] * len(succs)
    for v in range(len(succs) - 1, -1, -1):  # topological order: successors have larger indices
        desc[v] = succs[v]
        for w in bits(succs[v]):
            desc[v] |= desc[w]
    return desc


def brute_convex(preds: list[int]) -> set[int]:
    succs = successors(preds)
    desc = descendants(succs)
    n = len(preds)
    out = set()
    for m in range(1, 1 << n):
        outside_between = any(desc[p] >> q & 1 and desc[q] & m
                              for p in range(n) if m >> p & 1
                              for q in range(n) if not m >> q & 1)
        if not outside_between:
            out.add(m)
    return out


def test_chain_of_five():
    preds = preds_of("abcde", ["ab", "bc", "cd", "de"])
    states = execution_states(preds)
    assert len(states) == 6
    assert states[0] == 0 and states[-1] == 0b11111
    conv = convex_sets(states)
    assert len(conv) == 15                      # the contiguous runs
    assert conv == brute_convex(preds)


def test_diamond():
    names = "abcd"
    preds = preds_of(names, ["ab", "ac", "bd", "cd"])
    states = execution_states(preds)
    assert set(states) == {mask(names, s) for s in ["", "a", "ab", "ac", "abc", "abcd"]}
    conv = convex_sets(states)
    assert len(conv) == 12
    for bad in ["ad", "abd", "acd"]:
        assert mask(names, bad) not in conv
        assert not is_convex(mask(names, bad), preds)
    for good in ["bc", "abc", "bcd", "d", "abcd"]:
        assert mask(names, good) in conv
        assert is_convex(mask(names, good), preds)


def test_independent_nodes():
    preds = [0, 0, 0, 0]
    states = execution_states(preds)
    assert len(states) == 16
    assert len(convex_sets(states)) == 15


def test_fig4a_non_convex():
    # p1 -> p3 -> p5 and p1 -> p2: {p1, p2, p5} is not convex (p3 lies on the path p1 ~> p5).
    names = "12345"
    preds = preds_of(names, ["13", "35", "12", "24"])
    assert not is_convex(mask(names, "125"), preds)
    assert mask(names, "125") not in convex_sets(execution_states(preds))
    assert is_convex(mask(names, "135"), preds)
    assert is_convex(mask(names, "12"), preds)


def test_max_size_limits_convex_sets():
    preds = preds_of("abcde", ["ab", "bc", "cd", "de"])
    conv = convex_sets(execution_states(preds), max_size=2)
    assert len(conv) == 5 + 4
    assert all(m.bit_count() <= 2 for m in conv)


def test_caps_raise():
    with pytest.raises(TooManyStates):
        execution_states([0] * 8, cap=100)        # 256 states
    states = execution_states([0] * 6)
    with pytest.raises(TooManyStates):
        convex_sets(states, cap=20)              # 63 convex sets


def test_empty_segment():
    assert execution_states([]) == [0]
    assert convex_sets([0]) == set()
