"""docs/cli.rst stays in step with the command: every command, option and
environment variable is in it, and every layer option has an option."""

import os

import click

from asgi_amqp.tools import cli, layerconfig

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _reference():
    with open(os.path.join(ROOT, "docs", "cli.rst"), encoding="utf8") as handle:
        return handle.read()


def _options(command):
    return [p for p in command.params if isinstance(p, click.Option)]


def test_every_command_option_and_variable_is_documented():
    text = _reference()
    for name, command in cli.cli.commands.items():
        assert "asgi-amqp %s" % name in text, name
        for option in _options(command):
            assert option.opts[-1] in text, (name, option.opts)
            if option.envvar:
                assert "``%s``" % option.envvar in text, option.envvar


def test_every_layer_option_can_be_given_on_the_command_line():
    given = {option.name for option in _options(cli.cli)}
    wanted = set(layerconfig.LAYER_OPTIONS) - set(layerconfig.TOOL_OWNED)
    assert wanted <= given, wanted - given


def test_every_command_takes_the_shared_options():
    shared = {option.name for option in _options(cli.cli)} - {"version"}
    for name, command in cli.cli.commands.items():
        assert shared <= {option.name for option in _options(command)}, name
