"""Deprecated: the package is `jobqueue` now (`from jobqueue import JobQueue, task`).

`import webapp` and `import webapp.<anything>` keep working for one release: each name resolves to
the very module of `jobqueue` (one module object, so registries, settings and metrics are shared),
with a DeprecationWarning that names the new import.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
import warnings

warnings.warn(
    "the package 'webapp' is now 'jobqueue': write `import jobqueue` "
    "(`from jobqueue import JobQueue, task`); `webapp` goes away in the next release",
    DeprecationWarning,
    stacklevel=2,
)


class _Alias(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """webapp.X is jobqueue.X: the same module object under the old name."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname.startswith("webapp."):
            return importlib.util.spec_from_loader(fullname, self)
        return None

    def create_module(self, spec):
        module = importlib.import_module("jobqueue" + spec.name[len("webapp") :])
        spec.loader_state = module.__spec__
        return module

    def exec_module(self, module):
        # The import system just gave the module the alias's spec: give it back its own.
        module.__spec__ = module.__spec__.loader_state


if not any(isinstance(finder, _Alias) for finder in sys.meta_path):
    sys.meta_path.insert(0, _Alias())

_new = importlib.import_module("jobqueue")
__all__ = list(_new.__all__)


def __getattr__(name: str):
    return getattr(_new, name)
