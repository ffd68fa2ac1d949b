"""``asgi-amqp permissions``: the rabbitmqctl commands that give a user one role's rights."""

from ... import permissions as roles
from .base import EPILOG, _LayerErrors, cli, click
from .settings import Settings


@cli.command(epilog=EPILOG)
@click.argument("role", type=click.Choice(list(roles.ROLES)))
@click.argument("user")
@click.option("--vhost", default="/", show_default=True, help="The vhost the layer uses.")
@click.pass_obj
def permissions(settings: Settings, role: str, user: str, vhost: str) -> None:
    """Print the rabbitmqctl commands that give USER the rights of ROLE on the prefix.

    ROLE is "application" (daphne, runworker), "sender" (a job that only
    sends to existing channels) or "monitoring" (stats, through the
    management API). Nothing is sent to the broker.
    """
    with _LayerErrors():
        prefix = settings.config().get("prefix", "asgi")
        for line in roles.rabbitmqctl_commands(prefix, role, user, vhost):
            click.echo(line)
