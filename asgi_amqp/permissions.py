"""The RabbitMQ permissions each kind of user of a prefix needs, and no more.

RabbitMQ grants a user, per vhost, three regular expressions matched
against the names of queues and exchanges: *configure* (declare, delete),
*write* (publish to an exchange; be the destination of a binding) and
*read* (get, consume, purge; be the source of a binding). The patterns here
are derived from ``naming``: they admit exactly the objects one prefix's
layer makes. ``docs/permissions.rst`` shows them, and a test checks that
the page and this module agree.

Three things about RabbitMQ shape them:

* publishing to a queue goes through the default exchange, which RabbitMQ
  checks as write on ``amq.default``; that exchange reaches every queue of
  the vhost, so prefixes in one vhost cannot keep each other from
  *sending*. Give each application a vhost of its own where that matters.
* declaring a queue that has a dead-letter exchange needs read on the
  queue and write on that exchange. A user that may create channels can
  therefore also receive from them; the ``sender`` role may do neither.
* a passive declare needs no permission, so anyone with access to the
  vhost can learn whether a queue exists and how deep it is.
"""

from typing import Dict, NamedTuple, Tuple

from .naming import KINDS, SEPARATOR, SHARED_NAMES, check_prefix

ROLES = ("application", "sender", "monitoring")
NOTHING = "^$"
DEFAULT_EXCHANGE = r"amq\.default"

# Management API user tags per role: ``management`` lets a user read the
# vhosts it has permissions in, nothing more.
TAGS: Dict[str, Tuple[str, ...]] = {
    "application": (),
    "sender": (),
    "monitoring": ("management",),
}


class Permissions(NamedTuple):
    """The three patterns of ``rabbitmqctl set_permissions``, in its order."""

    configure: str
    write: str
    read: str


def _objects(prefix: str, kinds: Tuple[str, ...]) -> str:
    """A pattern (unanchored) for ``{prefix}:{kind}:...`` of ``kinds`` and the shared names."""
    kinds_pattern = "|".join(kinds)
    shared = "|".join(SHARED_NAMES)
    return "%s%s((%s)%s.+|%s)" % (
        prefix.replace(".", r"\."),
        SEPARATOR,
        kinds_pattern,
        SEPARATOR,
        shared,
    )


def permissions(prefix: str, role: str) -> Permissions:
    """``(configure, write, read)`` for a user in ``role`` of the layer on ``prefix``.

    ``application``
        daphne, runworker and anything else that receives or uses groups:
        declares and deletes all of the prefix's objects, publishes through
        the default exchange and the group router, binds, receives.
    ``sender``
        a job that only sends to channels that exist (``asgi-amqp send``,
        ``send`` and ``send_many``): write on the default exchange and
        nothing else. It cannot create a channel, receive, or touch groups.
    ``monitoring``
        ``asgi-amqp stats`` and ``top``, through the management API: no
        AMQP permission at all (the vhost access that comes with any
        entry), plus the ``management`` tag (``TAGS``).
    """
    check_prefix(prefix)
    if role == "application":
        # Everything is configured and read; what is never a binding's
        # destination nor a dead-letter exchange (lease queues) is not
        # written. (A publish through the default exchange needs write on it
        # alone.)
        every = _objects(prefix, KINDS)
        written = _objects(prefix, tuple(kind for kind in KINDS if kind != "e"))
        return Permissions(
            "^%s$" % every,
            "^(%s|%s)$" % (DEFAULT_EXCHANGE, written),
            "^%s$" % every,
        )
    if role == "sender":
        return Permissions(NOTHING, "^%s$" % DEFAULT_EXCHANGE, NOTHING)
    if role == "monitoring":
        return Permissions(NOTHING, NOTHING, NOTHING)
    raise ValueError("role must be one of %s, not %r" % (", ".join(ROLES), role))


def _quote(word: str) -> str:
    """A shell word: single-quoted unless it needs no quoting."""
    if word and all(c.isalnum() or c in "-_./" for c in word):
        return word
    return "'%s'" % word.replace("'", "'\\''")


def rabbitmqctl_commands(prefix: str, role: str, user: str, vhost: str = "/") -> Tuple[str, ...]:
    """The ``rabbitmqctl`` command lines that give ``user`` the rights of ``role``."""
    configure, write, read = permissions(prefix, role)
    commands = [
        "rabbitmqctl set_permissions -p %s %s %s %s %s"
        % tuple(_quote(w) for w in (vhost, user, configure, write, read))
    ]
    tags = TAGS[role]
    if tags:
        commands.append("rabbitmqctl set_user_tags %s %s" % (_quote(user), " ".join(tags)))
    return tuple(commands)
