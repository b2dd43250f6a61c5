"""A shared pod's changes in fragmentation are computed once per group of nodes alike
(`fragmentation_kernels.alike`): every node must get the change it would get computed on its own, bit for
bit, however it differs from the nodes beside it, and by a single field or a single bit of it."""

from __future__ import annotations

import numpy as np

from fairgpu.plugins import fragmentation_kernels as kernels

GPUS, SHAPES = 8, 10


def _nodes(rng: np.random.Generator, n: int) -> dict[str, np.ndarray]:
    """n nodes copied from four templates, most of them exactly, the rest with one field moved: a GPU's free
    cores, the CPU, the memory, a shape's access, or the cached usable capacity, need or price by one ulp."""
    tmpl = {
        "free": rng.choice([0, 30, 60, 100], size=(4, GPUS)).astype(np.int64),
        "cpu": rng.choice([500, 4000, 64_000], size=4).astype(np.int64),
        "mem": rng.choice([512, 8192, 65_536], size=4).astype(np.int64),
        "access": rng.random((4, SHAPES)) < 0.8,
        "usable": rng.uniform(0, 800, size=4).astype(np.float32),
        "need": rng.uniform(5, 40, size=4),
        "price": rng.uniform(0.1, 2, size=4),
    }
    of = rng.integers(0, 4, size=n)
    nodes = {name: np.ascontiguousarray(v[of]) for name, v in tmpl.items()}
    for r in range(n):
        match rng.integers(0, 10):
            case 0:
                nodes["free"][r, rng.integers(GPUS)] += 10
            case 1:
                nodes["cpu"][r] = 700 if nodes["cpu"][r] != 700 else 500
            case 2:
                nodes["mem"][r] += 4096
            case 3:
                nodes["access"][r, rng.integers(SHAPES)] ^= True
            case 4:
                nodes["usable"][r] = np.nextafter(nodes["usable"][r], np.float32(np.inf))
            case 5:
                nodes["need"][r] = np.nextafter(nodes["need"][r], np.inf)
            case 6:
                nodes["price"][r] = np.nextafter(nodes["price"][r], np.inf)
    return nodes


def test_nodes_alike_but_for_one_field_get_their_own_change_bit_for_bit() -> None:
    rng = np.random.default_rng(3)
    n = 96
    nodes = _nodes(rng, n)
    need = rng.choice([10, 25, 50, 100], size=SHAPES).astype(np.int64)
    k = rng.choice([1, 1, 2], size=SHAPES).astype(np.int64)
    cpu_t = rng.choice([100, 600, 2000], size=SHAPES).astype(np.int64)
    mem_t = rng.choice([256, 4096, 10_000], size=SHAPES).astype(np.int64)
    gpu_per_mib = rng.choice([0.0, 0.01, 0.05], size=SHAPES)
    w32 = rng.uniform(0.01, 1, size=SHAPES).astype(np.float32)
    free = nodes["free"]
    fit = free[:, :, None] >= need
    fit_count, fit_free = fit.sum(axis=1), (fit * free[:, :, None]).sum(axis=1).astype(np.float32)

    def deltas(rows: np.ndarray, cores: int) -> np.ndarray:
        out = np.full((n, GPUS), np.inf)
        kernels.gpu_deltas(
            rows, free, fit_count, fit_free, nodes["cpu"], nodes["mem"], need, k, cpu_t, mem_t, nodes["access"],
            cores, 200, 1024, w32.astype(np.float64), w32, nodes["usable"], nodes["need"], nodes["price"], cores,
            1.0, gpu_per_mib, out,
        )  # fmt: skip
        return out

    # in any order, and by template (runs of nodes alike, which `alike` checks against the previous row's group
    # before it hashes)
    for rows in (rng.permutation(n), np.argsort(nodes["cpu"] * 7 + nodes["mem"], kind="stable")):
        groups = len(kernels.alike(rows, free, nodes["cpu"], nodes["mem"], nodes["access"], nodes["usable"],
                                   nodes["need"], nodes["price"])[1])  # fmt: skip
        assert 4 <= groups < n // 2  # most nodes share a group, the moved ones have their own
        for cores in (10, 30, 60):
            together = deltas(rows, cores)
            # fewer rows than `alike` groups from: each computed on its own
            alone = [deltas(rows[i : i + 1], cores) for i in range(n)]
            for i, r in enumerate(rows):
                assert np.array_equal(together[r].view(np.int64), alone[i][r].view(np.int64)), (cores, r)


def test_nodes_are_alike_only_when_every_field_is_the_same_bit_for_bit() -> None:
    """`same_node`, the check behind the hash (which cannot tell nodes apart whose hashes collide): two
    nodes alike, then each field moved alone on the second, by one core, one MiB, one shape's access, one
    ulp (and -0.0 against 0.0, equal as floats but not as bits)."""
    rng = np.random.default_rng(5)
    base = {
        "free": np.tile(rng.integers(0, 100, size=GPUS), (2, 1)),
        "cpu": np.full(2, 4000, dtype=np.int64),
        "mem": np.full(2, 8192, dtype=np.int64),
        "access": np.tile(rng.random(SHAPES) < 0.5, (2, 1)),
        "usable": np.full(2, 123.25, dtype=np.float32),
        "need": np.full(2, 17.5),
        "price": np.zeros(2),
    }

    def same(nodes: dict[str, np.ndarray]) -> bool:
        """Alike by the access rows a byte at a time and, padded to 16 columns, eight at a time: the same answer."""
        wide = np.zeros((2, 16), dtype=bool)
        wide[:, :SHAPES] = nodes["access"]
        answers = {
            bool(
                kernels.same_node(
                    0, 1, nodes["free"], nodes["cpu"], nodes["mem"], words, nodes["usable"].view(np.int32),
                    nodes["need"].view(np.int64), nodes["price"].view(np.int64),
                )
            )
            for words in (nodes["access"].view(np.uint8), wide.view(np.uint64))
        }  # fmt: skip
        assert len(answers) == 1
        return answers.pop()

    assert same(base)
    moves = {
        "free": lambda a: a.__setitem__((1, GPUS - 1), a[1, GPUS - 1] + 1),
        "cpu": lambda a: a.__setitem__(1, a[1] + 1),
        "mem": lambda a: a.__setitem__(1, a[1] + 1),
        "access": lambda a: a.__setitem__((1, SHAPES - 1), not a[1, SHAPES - 1]),
        "usable": lambda a: a.__setitem__(1, np.nextafter(a[1], np.float32(0))),
        "need": lambda a: a.__setitem__(1, np.nextafter(a[1], 0.0)),
        "price": lambda a: a.__setitem__(1, -0.0),
    }
    for name, move in moves.items():
        nodes = {k: v.copy() for k, v in base.items()}
        move(nodes[name])
        assert not same(nodes), name


def test_need_and_price_once_per_group_equal_each_node_computed_alone_bit_for_bit() -> None:
    """`need_price` (after new weights, every node's need and price once per group of nodes alike) against
    `need_rows` and its product one node at a time, on nodes alike but for a GPU's free cores, the memory or
    one shape's access, with the per-shape tables wider than the shapes learned (their spare columns zero,
    as `fragmentation_nodes.extend` leaves them)."""
    rng = np.random.default_rng(7)
    n = 96
    nodes = _nodes(rng, n)
    need = rng.choice([10, 25, 50, 100], size=SHAPES).astype(np.int64)
    k = rng.choice([1, 1, 2], size=SHAPES).astype(np.int64)
    mem_t = rng.choice([256, 4096, 10_000], size=SHAPES).astype(np.int64)
    need_cpu, need_gpu = rng.integers(0, 9, size=SHAPES) * 1000.0, rng.integers(1, 9, size=SHAPES) * 50.0
    w = rng.uniform(0.01, 1, size=SHAPES).astype(np.float32).astype(np.float64)
    free = nodes["free"]
    fit_count = np.zeros((n, SHAPES + 6), dtype=np.int64)
    fit_count[:, :SHAPES] = (free[:, :, None] >= need).sum(axis=1)
    access = np.zeros((n, SHAPES + 6), dtype=bool)
    access[:, :SHAPES] = nodes["access"]
    mem = nodes["mem"]
    rows = rng.permutation(n)
    per_need, per_price = kernels.need_price(rows, free, fit_count, mem, access, k, mem_t, need_cpu, need_gpu, 0.25, w)
    assert len(np.unique(per_price)) > 4  # the nodes differ: a wrong group shows
    for i, r in enumerate(rows):
        alone, uses = kernels.need_rows(rows[i : i + 1], fit_count, mem, access, k, mem_t, need_cpu, need_gpu, 0.25)
        price = kernels.matvec64(uses, w)
        assert per_need[i].view(np.int64) == alone[0].view(np.int64), r
        assert per_price[i].view(np.int64) == price[0].view(np.int64), r
