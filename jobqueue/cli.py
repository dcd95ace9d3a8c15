"""The `jobqueue` command: the queue's commands (jobqueue.core.cli) and `serve` from the web layer,
loaded only when asked for, so that `jobqueue enqueue` never imports Flask."""

from __future__ import annotations

import gc
import importlib

import click

from .core.cli import main, pause_collector

# Commands that live above the core: name -> ("module:attribute", the line `--help` shows).
LAZY_COMMANDS = {
    "serve": ("jobqueue.web.cli:serve", "Run the dashboard under gunicorn with embedded workers and the reaper.")
}


class _Lazy(click.Command):
    """Listed by `jobqueue --help` without importing its module; imported when it runs."""

    def __init__(self, name: str, target: str, short_help: str):
        super().__init__(name, short_help=short_help, help=short_help)
        self.target = target

    def load(self) -> click.Command:
        module, attribute = self.target.split(":")
        return getattr(importlib.import_module(module), attribute)

    def make_context(self, info_name, args, parent=None, **extra):
        return self.load().make_context(info_name, args, parent=parent, **extra)


class _Jobqueue(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted([*super().list_commands(ctx), *LAZY_COMMANDS])

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name in LAZY_COMMANDS:
            return _Lazy(name, *LAZY_COMMANDS[name])
        return super().get_command(ctx, name)


cli = _Jobqueue(
    name="jobqueue",
    commands=main.commands,
    params=main.params,
    callback=main.callback,
    help=main.help,
    context_settings=main.context_settings,
)


def run() -> None:
    """Console entry point."""
    pause_collector()  # until the command has what it needs (jobqueue.core.cli.started)
    try:
        cli(obj={})
    finally:
        gc.freeze()  # exiting: the interpreter need not scan what is left


if __name__ == "__main__":
    run()
