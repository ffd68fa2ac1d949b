"""The RabbitMQ permissions each kind of user of a prefix needs, and no more.

RabbitMQ grants a user, per vhost, three regular expressions on the names of queues and
exchanges: *configure* (declare, delete), *write* (publish to an exchange; be a binding's
destination) and *read* (get, consume, purge; be a binding's source). The patterns here
come from ``naming`` and admit exactly one prefix's objects; ``docs/permissions.rst``
shows them (test_the_docs_show_exactly_the_commands_of_the_code).

What RabbitMQ does that shapes them:

* a publish to a queue is write on ``amq.default``, which reaches every queue of the vhost
  (test_a_prefix_in_the_same_vhost_can_send_into_another): one vhost per application.
* declaring a queue with a dead-letter exchange needs read on the queue and write on the
  exchange: a user that may create channels may receive from them; ``sender`` does neither.
* a passive declare needs no permission (test_sender_sends_to_channels_that_exist), so
  anyone in the vhost can learn whether a queue exists and how deep it is.
"""

from typing import Dict, NamedTuple, Tuple

from .naming import KINDS, SEPARATOR, SHARED_NAMES, check_prefix

ROLES = ("application", "sender", "monitoring")
NOTHING = "^$"
DEFAULT_EXCHANGE = r"amq\.default"

# Management API user tags per role: ``management`` reads the vhosts the user has
# permissions in, nothing more (test_monitoring_reads_statistics_and_nothing_else).
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
        all of the prefix's objects, the default exchange and the group router.
    ``sender``
        a job that only sends to channels that exist (``asgi-amqp send``,
        ``send``, ``send_many``): write on the default exchange alone.
    ``monitoring``
        ``asgi-amqp stats`` and ``top``: no AMQP permission at all, plus the
        ``management`` tag (``TAGS``).
    """
    check_prefix(prefix)
    if role == "application":
        # Lease queues, never a binding's destination nor a dead-letter exchange, are
        # not written; everything is configured and read.
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
