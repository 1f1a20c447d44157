"""The Python split on the cases given as JSON on stdin (a list of
{rows, world, rank, epoch, seed, shuffle, split}); prints each case's
pieces, and each case's first permutation of 37, as JSON (tests/tests/data.rs
compares them with the Rust split's)."""

import json
import sys

from nestor.data._split import permutation, share

out = []
for c in json.load(sys.stdin):
    pieces = share(c["rows"], c["world"], c["rank"], c["epoch"], c["seed"], c["shuffle"], c["split"])
    out.append({"pieces": [list(p) for p in pieces], "perm": permutation(37, c["seed"], c["epoch"], c["rank"]).tolist()})
print(json.dumps(out))
