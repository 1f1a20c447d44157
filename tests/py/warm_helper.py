"""Imported by warm_script.py: says each time it is imported (WARM_IMPORTS),
and holds state a trial changes (which no later trial may see)."""

import os

with open(os.environ["WARM_IMPORTS"], "a") as f:
    f.write(f"{os.getpid()}\n")

STATE = []
