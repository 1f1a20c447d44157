"""A module the warm test's function imports: appends a line to $WARM_IMPORTS each time it is imported."""

import os

STATE = []

with open(os.environ["WARM_IMPORTS"], "a") as f:
    f.write(f"{os.getpid()}\n")
