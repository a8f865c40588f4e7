"""The user cache: derived data that is slow to build and cheap to rebuild (the named stdlib prompt sets).

Its directory is `$ACCHEAD_CACHE_DIR`, else `$ACCHEAD_CACHE` (the older name, still read), else
`$XDG_CACHE_HOME/acchead`, else `~/.cache/acchead`. MaG's bigram tables are kept there too. Deleting it at
any time is safe.

`cached_json(path, key, build)` returns the value stored at `path` under exactly `key`, else builds it,
stores it atomically (`acchead.rundir.atomic_write_text`) and returns it. A missing, unreadable, corrupt or
differently keyed file is rebuilt without a word; a cache that cannot be written costs a rebuild next time
and one warning line now.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

CACHE_ENV = "ACCHEAD_CACHE_DIR"


def cache_dir() -> Path:
    """The cache directory (see the module docstring); not created here."""
    for var in (CACHE_ENV, "ACCHEAD_CACHE"):
        if os.environ.get(var):
            return Path(os.environ[var]).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg).expanduser() if xdg else Path.home() / ".cache") / "acchead"


def cached_json(
    path: Path, key: dict[str, Any], build: Callable[[], Any], valid: Callable[[Any], bool] = lambda v: True
) -> Any:
    """The JSON value cached at `path` for `key` if it is there and `valid`, else `build()` (then cached).

    `key` must be JSON (it is compared after a JSON round trip, so tuples count as lists).
    """
    from acchead.rundir import atomic_write_text

    key = json.loads(json.dumps(key))
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        if isinstance(data, dict) and data.get("key") == key and valid(data.get("value")):
            return data["value"]
    except Exception:  # absent, unreadable or corrupt in any way: a cache is rebuilt, silently
        pass
    value = build()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(path, json.dumps({"key": key, "value": value}) + "\n")
    except OSError as e:
        print(f"acchead: warning: cannot write the cache file {path} ({e}); it is rebuilt on every run "
              f"(set ${CACHE_ENV} to a writable directory)", file=sys.stderr)
    return value
