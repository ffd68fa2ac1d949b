"""``asgi-amqp new-channel``, ``group-add``, ``group-discard``, ``group-members``, ``flush``."""

import json

from .base import (
    EPILOG,
    _LayerErrors,
    cli,
    click,
    confirm_or_stop,
)
from .settings import Settings

# -- channels and groups ------------------------------------------------------------------


@cli.command("new-channel", epilog=EPILOG)
@click.argument("pattern")
@click.pass_obj
def new_channel(settings: Settings, pattern: str) -> None:
    """Print a new, unused channel name made from PATTERN (which ends with '?')."""
    with _LayerErrors():
        click.echo(settings.layer().new_channel(pattern))


@cli.command("group-add", epilog=EPILOG)
@click.argument("group")
@click.argument("channel")
@click.pass_obj
def group_add(settings: Settings, group: str, channel: str) -> None:
    """Add CHANNEL to GROUP (for the layer's group_expiry)."""
    with _LayerErrors():
        settings.layer().group_add(group, channel)


@cli.command("group-discard", epilog=EPILOG)
@click.argument("group")
@click.argument("channel")
@click.pass_obj
def group_discard(settings: Settings, group: str, channel: str) -> None:
    """Remove CHANNEL from GROUP."""
    with _LayerErrors():
        settings.layer().group_discard(group, channel)


@cli.command("group-members", epilog=EPILOG)
@click.argument("group")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON list.")
@click.pass_obj
def group_members(settings: Settings, group: str, as_json: bool) -> None:
    """Print the channels in GROUP, one a line (needs the management API)."""
    with _LayerErrors():
        members = sorted(settings.layer().group_channels(group))
    if as_json:
        click.echo(json.dumps(members))
    else:
        for member in members:
            click.echo(member)


@cli.command(epilog=EPILOG)
@click.option("-y", "--yes", is_flag=True, help="Do not ask for confirmation.")
@click.pass_obj
def flush(settings: Settings, yes: bool) -> None:
    """Delete every channel, group and message under the prefix.

    Asks for confirmation unless --yes is given (needs the management API).
    """
    layer = settings.layer()
    if not yes:
        question = "Delete every channel, group and message with prefix %r on %s?" % (
            layer.topology.prefix,
            settings.where(),
        )
        confirm_or_stop(question, "nothing was flushed")
    with _LayerErrors():
        layer.flush()
    settings.note("flushed prefix %r" % layer.topology.prefix)
