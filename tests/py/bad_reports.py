"""A nestor trial that sends bad reports through the Python client, then good
ones. Each refusal must be a clear error, and only the good reports stored."""

import dataclasses
import math
import json
import os

import nestor


def expect(kind, fn, needle):
    try:
        fn()
    except kind as e:
        assert needle in str(e), f"{needle!r} not in {e!r}"
        print(f"refused: {e}", flush=True)
        return
    raise AssertionError(f"{fn} was not refused")


expect(TypeError, lambda: nestor.report({"loss": object()}), "'loss' is object")
expect(TypeError, lambda: nestor.report({"loss": 1.0, "notes": [math.nan]}), "'notes' is list [nan]: neither a number nor a JSON value")
expect(TypeError, lambda: nestor.report({"": 1.0}), "metric names must be non-empty strings")
expect(nestor.ReportError, lambda: nestor.report({"loss": 1.0}, checkpoint="/no/such/dir"), "is not a directory")

token = os.environ["NESTOR_TOKEN"]
os.environ["NESTOR_TOKEN"] = "wrong"
expect(nestor.ReportError, lambda: nestor.report({"loss": 1.0}), "UNAUTHENTICATED")
os.environ["NESTOR_TOKEN"] = token
nestor._channel = None

ctx = nestor.get_context()
nestor._context = dataclasses.replace(ctx, trial_id="trial_99999")
# An unknown trial gets the answer a wrong token gets: a stranger learns nothing of which trials run.
expect(nestor.ReportError, lambda: nestor.report({"loss": 1.0}), "UNAUTHENTICATED")
nestor._context = dataclasses.replace(ctx, world_rank=5)
expect(nestor.ReportError, lambda: nestor.report({"loss": 1.0}), "rank 5 out of range")
nestor._context = ctx

nestor.report({"loss": math.nan})
nestor.report({"loss": 1.0, "extra": 2, "note": "ok", "sizes": [1, 2], "flags": {"warm": True}})

# A driver that cannot be reached: a clear error, not a hang.
plan = json.loads(os.environ["NESTOR_RUN"])
plan["channel"] = {"addr": "http://127.0.0.1:1"}
os.environ["NESTOR_RUN"] = json.dumps(plan)
os.environ["NESTOR_CONNECT_TIMEOUT_S"] = "1"
nestor._channel = None
expect(nestor.ReportError, lambda: nestor.report({"loss": 1.0}), "cannot reach the nestor driver at http://127.0.0.1:1")
print("done", flush=True)
