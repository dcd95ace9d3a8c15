"""The one task, for Django's tasks framework (dj-queue, django-tasks-db): append a line."""

from django.tasks import task

from bench.peer_apps.append_line import append_line


@task
def append_task(key: str) -> None:
    append_line(key)
