"""Where the ``nestor`` binary is: ``NESTOR_BIN``, then the scripts directory
of this environment (where ``pip install`` put it), the user scheme's, a
``bin/`` beside the package (``pip install --target``), then ``PATH``."""

import os
import shutil
import sys
import sysconfig
from typing import List, Optional


def _candidates() -> List[str]:
    dirs = [sysconfig.get_path("scripts")]
    try:
        scheme = sysconfig.get_preferred_scheme("user")  # Python 3.10+
        dirs.append(sysconfig.get_path("scripts", scheme))
    except (AttributeError, KeyError):
        pass
    dirs.append(os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bin"))
    dirs.append(os.path.dirname(sys.executable))
    return [d for d in dirs if d]


def find() -> str:
    """The path of the ``nestor`` binary; raises FileNotFoundError saying how
    to get one."""
    env = os.environ.get("NESTOR_BIN")
    if env:
        if not os.access(env, os.X_OK):
            raise FileNotFoundError(f"NESTOR_BIN={env} is not an executable file")
        return env
    for d in _candidates():
        path = os.path.join(d, "nestor")
        if os.path.isfile(path) and os.access(path, os.X_OK):
            return path
    found: Optional[str] = shutil.which("nestor")
    if found:
        return found
    raise FileNotFoundError(
        "the nestor binary was not found: `pip install ./python` (from a nestor checkout) builds and installs it, "
        "or set NESTOR_BIN to a `nestor` built with `cargo build --release -p nestor-cli`"
    )
