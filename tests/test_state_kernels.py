"""The compiled booking (fairgpu/state_kernels.py) against HAMi's per-card rules written out in Python, as
ClusterState.fits and _apply read before it: the same verdict for every placement, right and wrong, and the
same arrays after every booking and release, in and out of dry runs."""

from __future__ import annotations

import numpy as np
import pytest

from fairgpu import state, state_kernels
from fairgpu.errors import StateError
from fairgpu.model import GpuDevice, NodeSpec
from fairgpu.model.node import exclusive_on
from fairgpu.state import _ARRAYS, ClusterState, Placement


def _nodes() -> list[NodeSpec]:
    """Cards of every kind the rules tell apart: 100-core cards, 200-core cards (a cores-100 task is a share
    there), an unhealthy card, a split count of 2, and a node with fewer cards than the widest (padding)."""
    return [
        NodeSpec("a", 8_000, 16_384, tuple(GpuDevice("m", 8_000, f"a{j}") for j in range(4)), split_count=3),
        NodeSpec(
            "b",
            6_000,
            8_192,
            (
                GpuDevice("m", 8_000, "b0", cores=200),
                GpuDevice("m", 8_000, "b1", healthy=False),
                GpuDevice("m", 4_000, "b2", split=2),
            ),
        ),
        NodeSpec("c", 4_000, 8_192, tuple(GpuDevice("m", 6_000, f"c{j}", cores=200, split=2) for j in range(4))),
    ]


def _reference_fits(st: ClusterState, p: Placement) -> bool:
    """ClusterState.fits as it read in Python (no MIG cards)."""
    i = p.node
    if not (0 <= i < st.num_nodes) or st.cpu_free[i] < p.cpu_m or st.mem_free[i] < p.memory_mib:
        return False
    slots = p.slots
    if not len(slots) == len(p.cores) == len(p.mem_mib) or sum(p.segments) not in (0, len(slots)):
        return False
    if p.segments:
        for entries in p.containers():
            if len({slots[e] for e in entries}) != len(entries):
                return False
    elif len(set(slots)) != len(slots):
        return False
    used: dict[int, tuple[int, int, int, bool]] = {}
    for s, c, m in zip(slots, p.cores, p.mem_mib, strict=True):
        if not (0 <= s < st.gpu_valid.shape[1]) or not st.gpu_usable[i, s]:
            return False
        if s in used:
            tasks, free_cores, free_mem, exclusive = used[s]
        else:
            tasks, free_cores = int(st.gpu_tasks[i, s]), int(st.gpu_cores_free[i, s])
            free_mem, exclusive = int(st.gpu_mem_free[i, s]), bool(st.gpu_exclusive[i, s])
        alone = bool(exclusive_on(c, st.gpu_whole[i, s]))
        if exclusive or tasks >= st.gpu_split[i, s] or free_cores < c or free_mem < m:
            return False
        if alone and tasks > 0:
            return False
        if c == 0 and free_cores == 0 and st.gpu_cores_cap[i, s] != 0:
            return False
        used[s] = (tasks + 1, free_cores - c, free_mem - m, alone)
    return True


def _reference_apply(st: ClusterState, arrays: dict[str, np.ndarray], p: Placement, sign: int) -> None:
    """ClusterState._apply as it read in Python, on copies of the state's arrays."""
    i = p.node
    arrays["cpu_free"][i] += sign * p.cpu_m
    arrays["mem_free"][i] += sign * p.memory_mib
    for s, cores, mem in zip(p.slots, p.cores, p.mem_mib, strict=True):
        arrays["gpu_cores_free"][i, s] += sign * cores
        arrays["node_cores_free"][i] += sign * cores
        arrays["gpu_mem_free"][i, s] += sign * mem
        arrays["gpu_tasks"][i, s] -= sign
        if exclusive_on(cores, st.gpu_whole[i, s]):
            arrays["gpu_exclusive"][i, s] = sign < 0
        now = arrays["gpu_tasks"][i, s] == 0 and st.gpu_healthy[i, s]
        arrays["node_idle_gpus"][i] += int(now) - int(arrays["gpu_idle"][i, s])
        arrays["gpu_idle"][i, s] = now


def _placement(rng: np.random.Generator) -> Placement:
    """A placement as any caller might write one: often fitting, often not (slots off the node or repeated,
    cores 0, 100 or 200 on 100- and 200-core cards, too much memory, containers sharing a card)."""
    k = int(rng.integers(0, 5))
    slots = tuple(int(s) for s in rng.integers(-1, 5, size=k))
    cores = tuple(int(c) for c in rng.choice([0, 0, 30, 50, 100, 100, 200], size=k))
    mem = tuple(int(m) for m in rng.choice([0, 500, 1_000, 3_000, 9_000], size=k))
    segments: tuple[int, ...] = ()
    if k > 1 and rng.random() < 0.4:  # two containers
        cut = int(rng.integers(1, k))
        segments = (cut, k - cut)
    node = int(rng.integers(-1, 4))
    return Placement(node, slots, cores, mem, int(rng.integers(0, 1_000)), int(rng.integers(0, 2_000)), segments)


# First, rules a random walk seldom reaches: a 0-core task on a 100-core card, then a cores-100 task there
# (refused: it wants the card to itself); two cores-100 containers sharing a 200-core card, then a 0-core task
# there (refused: no cores left); a third task on a card of split count 2 (refused); one core or MiB more
# than a card has left (refused).
_SCRIPTED = (
    Placement(0, (0,), (0,), (0,)),
    Placement(0, (0,), (100,), (0,)),
    Placement(0, (1, 1), (0, 100), (0, 0), segments=(1, 1)),
    Placement(1, (0, 0), (100, 100), (0, 0), segments=(1, 1)),
    Placement(1, (0,), (0,), (0,)),
    Placement(2, (3,), (10,), (10,)),
    Placement(2, (3, 3), (10, 10), (10, 10), segments=(1, 1)),
    Placement(2, (3,), (10,), (10,)),
    Placement(2, (0,), (150,), (0,)),
    Placement(2, (0,), (51,), (0,)),
    Placement(0, (2,), (10,), (8_000,)),
    Placement(0, (2,), (10,), (1,)),
)


def test_the_compiled_booking_gives_the_rules_verdicts_and_arrays_in_and_out_of_dry_runs():
    rng = np.random.default_rng(7)
    st = ClusterState(_nodes())
    placed: list[str] = []
    fitted = released = 0
    for n in range(3_000):
        if n >= len(_SCRIPTED) and placed and rng.random() < 0.3:  # give one back
            key = placed.pop(int(rng.integers(len(placed))))
            want = {name: getattr(st, name).copy() for name in _ARRAYS}
            p = st.placement(key)
            assert p is not None
            _reference_apply(st, want, p, +1)
            st.release(key)
            released += 1
        else:
            p = _SCRIPTED[n] if n < len(_SCRIPTED) else _placement(rng)
            fits = _reference_fits(st, p)
            assert st.fits(p) == fits, p
            if not fits:
                continue
            fitted += 1
            want = {name: getattr(st, name).copy() for name in _ARRAYS}
            _reference_apply(st, want, p, -1)
            if n % 5 == 0:  # booked in a dry run, which checks, journals the node, then books
                with st.dry_run():
                    st.assign(f"dry{n}", p)
                    for name, arr in want.items():
                        assert np.array_equal(getattr(st, name), arr), name
            st.assign(f"p{n}", p)
            placed.append(f"p{n}")
        for name, arr in want.items():
            assert np.array_equal(getattr(st, name), arr), name
        st.check_invariants()
    assert fitted > 300 and released > 200  # the walk booked and released, not only refused


def test_a_container_sees_the_cores_and_memory_the_containers_before_it_took_on_its_card():
    """Two containers on one card (split 3, 100 cores, 8,000 MiB): 60 + 40 cores fit and 60 + 41 do not;
    5,000 + 3,000 MiB fit and 5,000 + 3,001 do not; each refusal raised at assign, the state untouched."""
    st = ClusterState(_nodes()[:1])

    def two(cores: tuple[int, int], mem: tuple[int, int]) -> Placement:
        return Placement(0, (0, 0), cores, mem, segments=(1, 1))

    for fits, p in (
        (True, two((60, 40), (0, 0))),
        (False, two((60, 41), (0, 0))),
        (True, two((10, 10), (5_000, 3_000))),
        (False, two((10, 10), (5_000, 3_001))),
    ):
        assert st.fits(p) is fits, p
    before = {name: getattr(st, name).copy() for name in _ARRAYS}
    with pytest.raises(StateError):
        st.assign("over", two((60, 41), (0, 0)))
    for name, arr in before.items():
        assert np.array_equal(getattr(st, name), arr), name
    st.assign("ok", two((60, 40), (5_000, 3_000)))
    assert st.gpu_cores_free[0, 0] == 0 and st.gpu_mem_free[0, 0] == 0 and st.gpu_tasks[0, 0] == 2


def test_a_node_or_card_past_the_last_is_refused_before_anything_is_read_there(monkeypatch):
    """The kernel checks no bounds: a node one past the last, or a card one past a node's widest, must be
    refused by book's own checks before it reads there. Run as Python (book's own source), where a read past
    an array raises instead of returning whatever lies beyond it."""
    monkeypatch.setattr(state, "book", state_kernels.book.py_func)
    st = ClusterState(_nodes())
    g = st.gpu_valid.shape[1]
    for p in (
        Placement(st.num_nodes),
        Placement(-1),
        Placement(st.num_nodes, (0,), (10,), (10,)),
        Placement(0, (g,), (10,), (10,)),
        Placement(0, (-1,), (10,), (10,)),
    ):
        assert not st.fits(p), p
    assert st.fits(Placement(0, (0,), (10,), (10,))) and st.fits(Placement(st.num_nodes - 1, (0,), (10,), (10,)))


def test_a_task_asking_no_cores_fits_a_card_without_cores_but_not_one_whose_cores_are_all_taken():
    """HAMi: a card with devcore 0 takes 0-core tasks; a card with cores, all taken (here its one core),
    takes none."""
    cards = (GpuDevice("m", 8_000, "z0", cores=0), GpuDevice("m", 8_000, "z1", cores=1))
    st = ClusterState([NodeSpec("z", 8_000, 16_384, cards, split_count=4)])
    assert st.fits(Placement(0, (0,), (0,), (100,)))
    assert st.fits(Placement(0, (1,), (0,), (100,)))
    st.assign("one", Placement(0, (1,), (1,), (100,)))
    assert not st.fits(Placement(0, (1,), (0,), (100,)))
    st.assign("none", Placement(0, (0,), (0,), (100,)))
    assert st.fits(Placement(0, (0,), (0,), (100,)))
