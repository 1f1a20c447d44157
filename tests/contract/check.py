"""Reads every fixture of this directory with Python's reader of the run's
plan (``nestor._contract``) and prints what it found, as JSON (name ->
summary), for tests/tests/contract.rs to compare with the fixtures'
``expect`` and with the Rust reader's summary.

Usage: PYTHONPATH=python python3 tests/contract/check.py
"""

import glob
import json
import os
import sys

from nestor import _contract


def summary(env):
    try:
        plan = _contract.from_env(env)
    except _contract.PlanError as e:
        return {"error": str(e)}
    if plan is None:
        return {"error": "NESTOR_RUN is not set"}
    out = plan.out
    out_row = [out["kind"], out.get("dir") or out.get("store")]
    if out["kind"] == "upload":
        out_row.append(out["otherwise"]["kind"])
    back = plan.back
    return {
        "version": plan.version,
        "trial_id": plan.trial_id,
        "config": plan.config,
        "start_iteration": plan.start_iteration,
        "world_size": plan.world_size,
        "addr": plan.addr,
        "token": env.get(_contract.TOKEN_VAR, ""),
        "meet": [plan.meet["kind"], plan.meet.get("path")],
        "out": out_row,
        "back": [back["kind"], back.get("checkpoint") or back.get("uri")],
        "preemption_notice_s": plan.preemption.get("notice_s") if plan.preemption else None,
    }


here = os.path.dirname(os.path.abspath(__file__))
found = {}
for path in sorted(glob.glob(os.path.join(here, "*.json"))):
    with open(path) as f:
        fixture = json.load(f)
    found[os.path.basename(path)[:-5]] = summary(fixture["env"])
json.dump(found, sys.stdout)
