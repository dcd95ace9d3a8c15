"""The `jobqueue` command: the queue's commands (webapp.core.cli) and `serve` from the web layer,
loaded only when asked for, so that `jobqueue enqueue` never imports Flask."""

from __future__ import annotations

import importlib

import click

from .core.cli import main

# Commands that live above the core: name -> "module:attribute".
LAZY_COMMANDS = {"serve": "webapp.web.cli:serve"}


class _Jobqueue(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted([*super().list_commands(ctx), *LAZY_COMMANDS])

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name in LAZY_COMMANDS:
            module, attribute = LAZY_COMMANDS[name].split(":")
            return getattr(importlib.import_module(module), attribute)
        return super().get_command(ctx, name)


cli = _Jobqueue(name="jobqueue", commands=main.commands, params=main.params, callback=main.callback,
                help=main.help, context_settings=main.context_settings)


def run() -> None:
    """Console entry point."""
    cli(obj={})


if __name__ == "__main__":
    run()
