"""nestor's Weights & Biases logger, the Python half: one process per sweep.

The sweep's driver starts it with the settings as JSON in argv[1] and
sends it one JSON object per line on stdin:
  {"op": "start", "trial": ..., "config": {...}}
  {"op": "log", "trial": ..., "step": n, "metrics": {...}}
  {"op": "config", "trial": ..., "config": {...}}     (a PBT exploit)
  {"op": "end", "trial": ..., "state": "TERMINATED", "exit_code": 0}
  {"op": "close"}
Each trial is one W&B run (id <experiment>-<trial>, so a resumed sweep
goes on in the same run), grouped under the sweep. It prints "ready" once
wandb is imported, and its log goes to stderr.
"""
import json
import re
import sys


def main():
    opts = json.loads(sys.argv[1])
    try:
        import wandb
    except ImportError as e:
        print(f"error: {e}: install wandb in the Python the sweep uses ({sys.executable})", flush=True)
        return 2
    print("ready", flush=True)
    runs = {}

    def run_id(trial):
        return re.sub(r"[^A-Za-z0-9_-]", "-", f"{opts['group']}-{trial}")[:120]

    for line in sys.stdin:
        m = json.loads(line)
        op, trial = m["op"], m.get("trial")
        if op == "start":
            if trial not in runs:
                runs[trial] = wandb.init(
                    project=opts["project"], entity=opts.get("entity"), group=opts["group"], name=trial,
                    id=run_id(trial), resume="allow", config=m["config"], dir=opts["dir"], mode=opts.get("mode"),
                    tags=opts.get("tags") or None, reinit="create_new",
                )
        elif op == "log" and trial in runs:
            runs[trial].log(m["metrics"], step=m["step"])
        elif op == "config" and trial in runs:
            runs[trial].config.update(m["config"], allow_val_change=True)
        elif op == "end" and trial in runs:
            run = runs.pop(trial)
            run.summary["nestor_state"] = m["state"]
            run.finish(exit_code=m["exit_code"])
        elif op == "close":
            break
    for run in runs.values():
        run.finish()
    return 0


if __name__ == "__main__":
    sys.exit(main())
