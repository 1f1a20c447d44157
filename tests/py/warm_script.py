"""A TOML sweep's script (tests/tests/warm_scripts.rs): reports how it was
run (its process, its arguments, ``__main__``, what an earlier trial left),
or fails as its trial's ``x`` says."""

import os
import sys

import warm_helper

import nestor

warm_helper.STATE.append(os.getpid())


def main() -> None:
    x = nestor.get_config()["x"]
    if x == "raise":
        raise ValueError("this trial fails on purpose")
    if x == "exit":
        sys.exit(3)
    nestor.report({
        "leaked": len(warm_helper.STATE) - 1,
        "pid": os.getpid(),
        "ppid": os.getppid(),
        "argv": " ".join(sys.argv),
        "file_abs": os.path.isabs(__file__),
        "path0": sys.path[0] == os.path.dirname(os.path.abspath(__file__)),
        "threads_env": os.environ.get("OMP_NUM_THREADS", ""),
    })


if __name__ == "__main__":
    main()
