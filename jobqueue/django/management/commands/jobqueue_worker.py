"""manage.py jobqueue_worker [--concurrency N] [--queues a,b] [--burst] ...: `jobqueue worker`
with this project's settings: its Django tasks, and the database the TASKS backend writes to
(JOBQUEUE_DATABASE_URL, when set, wins)."""

from __future__ import annotations

import os

from django.core.management.base import BaseCommand, handle_default_options

from ...connection import database_url
from ...framework import task_backends


class Command(BaseCommand):
    help = "Run the job queue's worker on this project's Django tasks (options as for `jobqueue worker`)."

    def add_arguments(self, parser) -> None:
        parser.add_argument("--backend", default="default", help="The TASKS alias whose database the worker serves")

    def run_from_argv(self, argv: list[str]) -> None:
        # Every option Django's parser does not know goes to `jobqueue worker` as it is.
        parser = self.create_parser(argv[0], argv[1])
        options, worker_args = parser.parse_known_args(argv[2:])
        handle_default_options(options)
        self.execute(**vars(options), worker_args=worker_args)

    def handle(self, *args, backend: str, worker_args: list[str] = (), **options) -> None:
        from jobqueue.core.cli import main

        task_backends.all()  # each backend adds the finder of its tasks to the registry
        os.environ.setdefault("JOBQUEUE_DATABASE_URL", database_url(task_backends[backend].database))
        main(["worker", *worker_args], prog_name="manage.py jobqueue_worker")
