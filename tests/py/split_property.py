"""Property test of nestor.data's split (tests/tests/data.rs draws a new
seed every run): random blocks, world sizes 1-5, 4 epochs, shuffled or not.

Usage: split_property.py SEED CASES
Checks, for every case: each rank the same number of rows (total // world),
no row read twice in an epoch, the rows left out never the same two epochs
in a row, every piece inside its block, and the same pieces when asked again.
"""

import random
import sys

from nestor.data._split import permutation, rows_per_rank, share

seed, cases = int(sys.argv[1]), int(sys.argv[2])
rng = random.Random(seed)
for case in range(cases):
    rows = [rng.choice([0, 1, rng.randint(0, 50)]) for _ in range(rng.randint(0, 12))]
    total, world, shuffle, data_seed = sum(rows), rng.randint(1, 5), rng.random() < 0.5, rng.randint(0, 1 << 30)
    split = rng.random() < 0.9
    where = f"case {case} (seed {seed}): rows={rows} world={world} shuffle={shuffle} split={split} data_seed={data_seed}"
    before = None
    for epoch in range(4):
        seen = []
        for rank in range(world):
            pieces = share(rows, world, rank, epoch, data_seed, shuffle, split)
            assert pieces == share(rows, world, rank, epoch, data_seed, shuffle, split), where
            assert all(0 <= lo < hi <= rows[b] for b, lo, hi in pieces), f"{where}: {pieces}"
            n = sum(hi - lo for _, lo, hi in pieces)
            assert n == rows_per_rank(total, world, split), f"{where}: rank {rank} epoch {epoch} reads {n}"
            mine = [(b, i) for b, lo, hi in pieces for i in range(lo, hi)]
            if not split or world == 1:
                assert sorted(mine) == sorted((b, i) for b in range(len(rows)) for i in range(rows[b])), f"{where}: rank {rank}"
            seen += mine
        if not split or world == 1:
            continue
        assert len(seen) == len(set(seen)), f"{where}: a row twice in epoch {epoch}"
        left = {(b, i) for b in range(len(rows)) for i in range(rows[b])} - set(seen)
        assert len(left) == (total % world if total >= world else total), where
        if before is not None and total >= world:
            assert not (left & before), f"{where}: epoch {epoch} left out {sorted(left & before)} again"
        before = left
# The seeded permutations: each a permutation, a new one per epoch and per stream, the same when drawn again.
for case in range(200):
    n, s, e, w = rng.randint(0, 3000), rng.randint(0, 1 << 62), rng.randint(0, 100), rng.randint(0, 1 << 40)
    p = permutation(n, s, e, w).tolist()
    assert sorted(p) == list(range(n)), f"seed {seed}: permutation({n}, {s}, {e}, {w}) is not one"
    assert p == permutation(n, s, e, w).tolist()
    if n >= 16:
        assert p != permutation(n, s, e + 1, w).tolist() and p != permutation(n, s, e, w + 1).tolist(), (seed, n, s, e, w)
print(f"ok {cases} cases")
