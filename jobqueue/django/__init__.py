"""Django integration (`pip install jobqueue[django]`): a backend for Django's tasks framework
(django.tasks on Django 6, the django-tasks backport on 5.2), `manage.py jobqueue_worker`, and the
dashboard behind Django's admin login. See docs/django.md."""

from __future__ import annotations

from typing import Any

__all__ = ["JobQueueBackend"]


def __getattr__(name: str) -> Any:
    # Lazily: INSTALLED_APPS imports this package before Django's apps are ready.
    if name == "JobQueueBackend":
        from .backend import JobQueueBackend

        return JobQueueBackend
    raise AttributeError(name)
