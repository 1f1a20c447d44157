"""A TOML writer for the experiment files the Python driver hands to the
binary: tables, inline tables, arrays, strings, numbers and booleans."""

import json
import math
import re
from typing import Any, Dict, List

_BARE = re.compile(r"^[A-Za-z0-9_-]+$")


def _key(k: str) -> str:
    if not isinstance(k, str):
        raise TypeError(f"TOML keys must be strings, got {k!r}")
    return k if _BARE.match(k) else json.dumps(k)


def value(v: Any) -> str:
    """One value, inline (tables as inline tables)."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        if math.isnan(v):
            return "nan"
        if math.isinf(v):
            return "inf" if v > 0 else "-inf"
        text = repr(v)
        return text if any(c in text for c in ".eE") else text + ".0"
    if isinstance(v, str):
        return json.dumps(v, ensure_ascii=False)
    if isinstance(v, dict):
        return "{ " + ", ".join(f"{_key(k)} = {value(x)}" for k, x in v.items()) + " }" if v else "{}"
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(value(x) for x in v) + "]"
    if hasattr(v, "item") and callable(v.item):  # a numpy scalar
        return value(v.item())
    if v is None:
        raise TypeError("TOML has no null: leave the key out instead of None")
    raise TypeError(f"cannot write {type(v).__name__} {v!r} as TOML")


def dumps(doc: Dict[str, Any]) -> str:
    """A document: top-level scalars first, then each table as a [section]
    (nested tables as [a.b] sections, inline where they sit in arrays)."""
    lines: List[str] = []

    def table(prefix: str, t: Dict[str, Any]) -> None:
        subs = []
        if prefix:
            lines.append(f"[{prefix}]")
        for k, v in t.items():
            if v is None:
                continue
            if isinstance(v, dict) and not _inline(v):
                subs.append((k, v))
            else:
                lines.append(f"{_key(k)} = {value(v)}")
        if prefix:
            lines.append("")
        for k, v in subs:
            table(f"{prefix}.{_key(k)}" if prefix else _key(k), v)

    table("", doc)
    return "\n".join(lines) + "\n"


def _inline(v: Dict[str, Any]) -> bool:
    # A search-space domain ({"loguniform": [..]}) stays inline.
    return getattr(v, "_inline", False)


class Inline(dict):
    """A table written inline (`{ k = v }`), as a space's domains are."""

    _inline = True
