"""Environment switches read at every call, cheaply (the eager paths read a few of them at each launch).

``os.environ.get`` encodes the name and decodes the value at each call (~0.6 us on a CPU, a dozen and more calls a
decoder layer); on POSIX, ``os.environ`` keeps its contents in a dict of bytes (``_data``), which its setters (and
``putenv``-free code such as pytest's ``monkeypatch.setenv``) write, so a lookup there sees every change made through
``os.environ``. Elsewhere, or where that dict is missing, :func:`getenv` is ``os.environ.get``.
"""

from __future__ import annotations

import os

_DATA = getattr(os.environ, "_data", None) if os.name == "posix" else None
if not isinstance(_DATA, dict):
    _DATA = None


def getenv(name: str, default: str) -> str:
    """``os.environ.get(name, default)``."""
    if _DATA is None:
        return os.environ.get(name, default)
    value = _DATA.get(name.encode())
    return default if value is None else value.decode()
