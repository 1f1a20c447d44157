"""How a data set is split across a trial's ranks, epoch by epoch: a pure
function of the blocks' row counts, the world size, the rank, the epoch and
the seed, so every rank computes its share alone (on any node, after any
restart) and the shares never overlap.

Of the N rows, ``N % world`` are left out each epoch: a window of the
blocks (Parquet row groups, or whole CSV/JSON files) in their given order,
moving on by its own length each epoch, so no row is left out twice in a
row. The rest, the blocks end to end (in a seeded new order each epoch when
the data set is shuffled), is cut into ``world`` runs of ``N // world``
rows: every rank gets the same number of rows and no row reaches two ranks.
"""

from typing import Any, List, Sequence, Tuple

#: A piece of a rank's share: (block index, first row in the block, end row).
Piece = Tuple[int, int, int]

_MASK = (1 << 64) - 1
_GOLDEN = 0x9E3779B97F4A7C15
#: The stream of the blocks' order (a row permutation's stream is its block's index).
_BLOCKS = _MASK


def _mix(x: int) -> int:
    """splitmix64's finaliser, on one 64-bit integer."""
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK
    return x ^ (x >> 31)


def stream(seed: int, epoch: int, which: int) -> int:
    """The 64-bit stream of one permutation: ``(seed, epoch, which)`` mixed."""
    s = _mix((seed & _MASK) ^ 0x6E6573746F72)  # "nestor"
    s = _mix(s ^ (((epoch & _MASK) + _GOLDEN) & _MASK))
    return _mix(s ^ (((which & _MASK) + _GOLDEN) & _MASK))


def permutation(n: int, seed: int, epoch: int, which: int) -> Any:
    """A seeded permutation of ``range(n)`` (a NumPy array): the indices
    sorted by splitmix64 keys, ``mix(stream + (i + 1) * golden)``, ties by
    index. Specified to the bit, so any language can draw the same one."""
    import numpy as np

    with np.errstate(over="ignore"):
        i = np.arange(1, n + 1, dtype=np.uint64)
        x = np.uint64(stream(seed, epoch, which)) + i * np.uint64(_GOLDEN)
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        x = x ^ (x >> np.uint64(31))
    return np.argsort(x, kind="stable")


def block_order(n_blocks: int, epoch: int, seed: int, shuffle: bool) -> List[int]:
    """The blocks' order in ``epoch``: as given, or the seeded permutation
    of ``(seed, epoch)`` (the same on every machine)."""
    if not shuffle:
        return list(range(n_blocks))
    return [int(b) for b in permutation(n_blocks, seed, epoch, _BLOCKS)]


def share(rows: Sequence[int], world: int, rank: int, epoch: int, seed: int = 0, shuffle: bool = False,
          split: bool = True) -> List[Piece]:
    """The pieces of blocks rank ``rank`` of ``world`` reads in ``epoch``,
    in reading order. ``rows[i]`` is block i's row count."""
    if not 0 <= rank < world:
        raise ValueError(f"rank {rank} of a world of {world}")
    order = block_order(len(rows), epoch, seed, shuffle)
    total = sum(rows)
    if not split or world == 1 or total == 0:
        return [(b, 0, rows[b]) for b in order if rows[b] > 0]
    per, left = divmod(total, world)
    if per == 0:
        return []
    # The rows left out this epoch: a window of the blocks in their given
    # order that moves on by its own length each epoch.
    first = [0]
    for r in rows:
        first.append(first[-1] + r)
    out_lo = (epoch * left + world * per) % total
    holes = [(out_lo, min(out_lo + left, total))]
    if out_lo + left > total:
        holes.append((0, out_lo + left - total))
    # The epoch's sequence without them, then this rank's run of it.
    want_lo, want_hi = rank * per, (rank + 1) * per
    pieces: List[Piece] = []
    at = 0
    for b in order:
        runs = [(0, rows[b])]
        for lo, hi in holes:
            lo, hi = max(lo - first[b], 0), min(hi - first[b], rows[b])
            if lo >= hi:
                continue
            runs = [part for s, e in runs for part in ((s, min(e, lo)), (max(s, hi), e)) if part[0] < part[1]]
        for s, e in runs:
            n = e - s
            lo, hi = max(want_lo - at, 0), min(want_hi - at, n)
            if lo < hi:
                pieces.append((b, s + lo, s + hi))
            at += n
            if at >= want_hi:
                return pieces
    return pieces


def rows_per_rank(total: int, world: int, split: bool = True) -> int:
    """How many rows each rank reads an epoch."""
    if not split or world <= 1:
        return total
    return total // world
