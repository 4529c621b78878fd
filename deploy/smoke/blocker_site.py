"""sitecustomize for processes that must run with only what an image installs.

Copied as `sitecustomize.py` into a folder put first on PYTHONPATH, next to a `blocked.json`
(written by deploy/smoke/install.py): importing one of its top-level modules fails as it would
where the package is not installed (`import x` raises ModuleNotFoundError, and
`importlib.util.find_spec("x")` is None, which is how libraries probe optional packages), and
importlib.metadata no longer lists its distribution.
"""

import importlib.metadata
import json
import sys
from pathlib import Path

_SPEC = json.loads(Path(__file__).with_name("blocked.json").read_text())
_MODULES = frozenset(_SPEC["modules"])
_DISTS = frozenset(_SPEC["distributions"])


class _Hiding:
    """A meta path finder that finds nothing of the blocked modules (else asks the one it wraps)."""

    def __init__(self, inner):  # type: ignore[no-untyped-def]
        self._inner = inner

    def find_spec(self, fullname, path=None, target=None):  # type: ignore[no-untyped-def]
        if fullname.partition(".")[0] in _MODULES:
            return None
        return self._inner.find_spec(fullname, path, target)

    def __getattr__(self, name):  # type: ignore[no-untyped-def]
        return getattr(self._inner, name)


def _norm(name: str) -> str:
    return name.lower().replace("-", "_").replace(".", "_")


_discover = importlib.metadata.Distribution.discover.__func__  # type: ignore[attr-defined]


def _visible(cls, **kwargs):  # type: ignore[no-untyped-def]
    for dist in _discover(cls, **kwargs):
        if _norm(dist.metadata["Name"] or "") not in _DISTS:
            yield dist


importlib.metadata.Distribution.discover = classmethod(_visible)  # type: ignore[assignment]
sys.meta_path[:] = [
    f if f.__module__ == "_frozen_importlib" or not hasattr(f, "find_spec") else _Hiding(f)
    for f in sys.meta_path
]
