"""The permission patterns admit the prefix's own objects and nothing else, and the docs show them.

No broker here: the patterns are checked against the names ``naming``
makes (RabbitMQ matches them as PCRE, which agrees with Python's ``re``
on these), docs/permissions.rst is checked to hold exactly the commands
that ``asgi_amqp.permissions`` gives, and ``asgi-amqp permissions`` to
print them. tests/test_least_privilege.py runs them on a broker.
"""

import os
import re

import pytest
from click.testing import CliRunner

from asgi_amqp import naming, permissions
from asgi_amqp.tools import cli

DOC = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "docs")
# The users and vhost of docs/permissions.rst's examples, for its prefix "asgi".
DOC_USERS = {"application": "myapp-web", "sender": "myapp-cron", "monitoring": "myapp-monitor"}
DOC_VHOST = "myapp"


def _names(prefix):
    """Every kind of object the layer on ``prefix`` makes."""
    topology = naming.Topology(prefix, 60, 86400, lambda channel: 100)
    return {
        "channel queue": topology.channel_queue("chat.lobby"),
        "reply queue": topology.channel_queue("daphne.response.ab?Xy12"),
        "local queue": topology.channel_queue("daphne.response.p1!abc"),
        "lease queue": topology.lease_queue,
        "group exchange": topology.group_exchange("room.1"),
        "member exchange": topology.member_exchange("daphne.response.p1!abc"),
        "router": topology.group_router,
        "dead-letter exchange": topology.dead_letter_exchange,
        "dead-letter queue": topology.dead_letter_queue,
    }


def _matches(pattern, name):
    return re.search(pattern, name) is not None


@pytest.mark.parametrize("prefix", ["asgi", "my.app", "a-b_c"])
def test_the_application_may_configure_and_read_all_its_objects(prefix):
    configure, write, read = permissions.permissions(prefix, "application")
    for kind, name in _names(prefix).items():
        assert _matches(configure, name), kind
        assert _matches(read, name), kind
        # Lease queues are never a binding's destination nor a dead-letter target.
        assert _matches(write, name) == (kind != "lease queue"), kind
    assert _matches(write, "amq.default")


@pytest.mark.parametrize("prefix", ["asgi", "my.app"])
def test_no_role_reaches_a_neighbouring_prefix_or_a_foreign_name(prefix):
    neighbours = [prefix + "b", prefix + "2", "x" + prefix, prefix.replace(".", "x") + "x"]
    if "." in prefix:
        neighbours.append(prefix.replace(".", "x"))
    foreign = [name for neighbour in neighbours for name in _names(neighbour).values()] + [
        prefix + ":x:other",
        prefix + ":q",
        prefix + ":q:",
        prefix + ":groups.extra",
        "amq.direct",
        "amq.default.x",
    ]  # not "": RabbitMQ checks the default exchange's empty name as "amq.default"
    for role in permissions.ROLES:
        for pattern in permissions.permissions(prefix, role):
            for name in foreign:
                assert not _matches(pattern, name), (role, pattern, name)


def test_the_sender_and_monitoring_get_nothing_but_the_default_exchange():
    names = list(_names("asgi").values())
    configure, write, read = permissions.permissions("asgi", "sender")
    assert not any(_matches(p, n) for p in (configure, read) for n in names + ["amq.default"])
    assert [n for n in names + ["amq.default"] if _matches(write, n)] == ["amq.default"]
    for pattern in permissions.permissions("asgi", "monitoring"):
        assert not any(_matches(pattern, n) for n in names + ["amq.default"])
    assert permissions.TAGS["monitoring"] == ("management",)


@pytest.mark.parametrize("prefix", ["", "*", "a:b", ".*"])
def test_a_prefix_that_is_not_a_layer_prefix_gets_no_patterns(prefix):
    with pytest.raises(ValueError, match="prefix"):
        permissions.permissions(prefix, "application")


def test_an_unknown_role_is_refused():
    with pytest.raises(ValueError, match="role"):
        permissions.permissions("asgi", "admin")


def test_the_docs_show_exactly_the_commands_of_the_code():
    with open(os.path.join(DOC, "permissions.rst"), encoding="utf8") as page:
        text = page.read()
    documented = [
        line.strip() for line in text.splitlines() if line.strip().startswith("rabbitmqctl set_")
    ]
    expected = [
        line
        for role in permissions.ROLES
        for line in permissions.rabbitmqctl_commands("asgi", role, DOC_USERS[role], DOC_VHOST)
    ]
    assert sorted(set(expected)) == sorted(set(documented) - {_tag_hint()})
    assert _tag_hint() in text  # the application's optional management tag
    cli_example = permissions.rabbitmqctl_commands("asgi", "sender", "myapp-cron", DOC_VHOST)[0]
    assert "$ asgi-amqp --prefix asgi permissions sender myapp-cron --vhost myapp" in text
    assert text.count(cli_example) == 2  # the CLI example's output and the sender's section


def _tag_hint():
    return "rabbitmqctl set_user_tags myapp-web management"


def test_the_cli_prints_the_commands():
    runner = CliRunner()
    result = runner.invoke(
        cli.cli, ["--prefix", "my.app", "permissions", "monitoring", "watcher", "--vhost", "prod"]
    )
    assert result.exit_code == 0, result.output
    assert result.output.splitlines() == list(
        permissions.rabbitmqctl_commands("my.app", "monitoring", "watcher", "prod")
    )
    refused = runner.invoke(cli.cli, ["--prefix", "a*", "permissions", "sender", "x"])
    assert refused.exit_code == 2
