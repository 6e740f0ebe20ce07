"""The planner's cost function memoizes a candidate's time by its structure (``candidates.structure``):
a repeated layer's candidates are costed once, and the time is the one costing them afresh gives."""
import pytest
import torch

import tilefuse
from tilefuse.cost.target import Target
from tilefuse.orchestrate import enumerate_candidates
from tilefuse.orchestrate.candidates import structure
from tilefuse.orchestrate.costing import Coster
from tilefuse.orchestrate.segment import split_segments


class Block(torch.nn.Module):
    def __init__(self, d: int = 64):
        super().__init__()
        self.up, self.down, self.norm = torch.nn.Linear(d, 2 * d), torch.nn.Linear(2 * d, d), torch.nn.LayerNorm(d)

    def forward(self, x):
        return self.norm(x + self.down(torch.nn.functional.gelu(self.up(x))))


@pytest.fixture(scope="module")
def two_layers():
    torch.manual_seed(0)
    model = torch.nn.Sequential(Block(), Block()).eval().half()
    x = torch.randn(16, 64, dtype=torch.float16)
    return tilefuse.compile(model, (x,), target="h100", backend="reference", time_limit=2.0).primgraph


def _candidates(pg, coster):
    return [c for seg in split_segments(pg) for c, _ in enumerate_candidates(seg, coster)]


def test_a_structure_is_costed_once_at_the_time_costing_it_afresh_gives(two_layers):
    pg = two_layers
    target = Target.get("h100")
    coster = Coster(pg.types, target)
    costed = set()
    real_options = coster.options

    def counting(cand):
        costed.add(cand.names)
        return real_options(cand)
    coster.options = counting
    cands = _candidates(pg, coster)
    structures = {structure(c, pg.types) for c in cands}
    assert len(structures) < len(cands)                 # the second layer repeats the first's
    assert not {c.names for c in cands} <= costed       # and its candidates were not costed again
    costed.clear()
    times = [coster(c) for c in cands]
    assert not costed                                   # every candidate's time was memoized
    fresh = Coster(pg.types, target)                    # no memo: every candidate costed by the families
    for c, t in zip(cands, times):
        best = fresh.best(c)
        assert t == (None if best is None else best[0].seconds), str(c)


def test_a_measured_time_serves_every_candidate_of_its_structure(two_layers):
    """Measured times are keyed by structure (``Schedule.key``): the other layer's twin of a
    measured kernel takes its time too, memoized or costed afresh."""
    pg = two_layers
    target = Target.get("h100")
    modelled = Coster(pg.types, target)
    cands = _candidates(pg, modelled)
    by_structure: dict = {}
    pair = None
    for c in cands:
        twin = by_structure.setdefault(structure(c, pg.types), c)
        if twin is not c and twin.names != c.names and modelled.best(c) is not None:
            pair = (twin, c)
            break
    assert pair is not None
    a, b = pair
    key = modelled.best(a)[1].key()
    measured = Coster(pg.types, target, measured={key: 1e-9})     # (faster than any modelled one)
    assert measured(a) == measured(b) == 1e-9 != modelled(b)
    assert Coster(pg.types, target, measured={key: 1e-9}).best(b)[0].seconds == 1e-9
