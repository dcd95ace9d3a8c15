"""Importing the modules that register tasks: the built-in ones and the user's
(`--tasks myapp.tasks`, `JOBQUEUE_TASKS`)."""

from __future__ import annotations

import importlib
from collections.abc import Iterable

from .settings import current


def load_task_modules(modules: str | Iterable[str] | None = None) -> list[str]:
    """Import the built-in tasks and the user's task modules (comma-separated or a list; default
    the settings' JOBQUEUE_TASKS). Returns the user modules imported."""
    importlib.import_module("jobqueue.core.builtin_tasks")
    if modules is None:
        modules = current().task_modules or ()
    if isinstance(modules, str):
        modules = [m.strip() for m in modules.split(",")]
    loaded = []
    for module in modules:
        if module:
            importlib.import_module(module)
            loaded.append(module)
    return loaded
