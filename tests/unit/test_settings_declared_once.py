"""Each setting's default is written once, in its `Settings` field (issue 23: the stop grace was
20 s in settings.py but 30 s in worker/config.py and in `jobqueue worker --grace-seconds`). Any
other place that takes the same value (a flag of the command line, a field of WorkerConfig) reads
it from the declaration; a literal written there again fails here."""

from __future__ import annotations

import ast
import dataclasses
import inspect

import click
import pytest

from jobqueue.cli import cli
from jobqueue.core import settings
from jobqueue.core.worker import config as worker_config

ATTRIBUTES = {s.attribute for s in settings.SETTINGS}


def every_option():
    ctx = click.Context(cli)
    for param in cli.params:
        yield "jobqueue", param
    for name in cli.list_commands(ctx):
        command = cli.get_command(ctx, name)
        command = command.load() if hasattr(command, "load") else command
        for param in command.params:
            yield name, param


def test_every_flag_named_after_a_setting_takes_its_default_from_the_declaration(monkeypatch):
    for setting in settings.SETTINGS:
        monkeypatch.delenv(settings.PREFIX + setting.name, raising=False)
    checked = 0
    for command, param in every_option():
        if param.name not in ATTRIBUTES or getattr(param, "is_flag", False) or param.default in (None, ()):
            continue
        assert callable(param.default), (
            f"`jobqueue {command} --{param.name.replace('_', '-')}` writes its default ({param.default!r}) again: "
            "use cli.setting_option, which reads settings.py's declaration"
        )
        assert param.default() == getattr(settings.DEFAULTS, param.name)
        checked += 1
    assert checked >= 5  # log level, lease, grace, web and embedded workers


def test_worker_config_takes_the_settings_defaults_from_the_declaration():
    tree = ast.parse(inspect.getsource(worker_config.WorkerConfig))
    shared = [f.name for f in dataclasses.fields(worker_config.WorkerConfig) if f.name in ATTRIBUTES]
    assert shared, "WorkerConfig shares no field with Settings any more: drop this test"
    for node in ast.walk(tree):
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.target.id in shared:
            assert not isinstance(node.value, ast.Constant), (
                f"WorkerConfig.{node.target.id} writes its default again; take settings.DEFAULTS.{node.target.id}"
            )
    for name in shared:
        assert getattr(worker_config.WorkerConfig(), name) == getattr(settings.DEFAULTS, name)


def test_one_setting_one_declaration():
    names = [s.name for s in settings.SETTINGS]
    assert len(names) == len(set(names))
    assert {f.name for f in dataclasses.fields(settings.Settings)} == ATTRIBUTES | {"port"}


@pytest.mark.parametrize("raw", ["nan", "inf", "-inf", "NaN"])
def test_numbers_refuse_nan_and_infinities(raw):
    with pytest.raises(settings.SettingsError, match="JOBQUEUE_GRACE_SECONDS"):
        settings.Settings.from_env({"JOBQUEUE_GRACE_SECONDS": raw})
