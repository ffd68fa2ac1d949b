"""Each role of ``asgi_amqp.permissions`` can do its job with a real restricted user, and no more.

Users are made through the session broker's management API with exactly
the permissions and tags that ``permissions`` gives (the patterns that
docs/permissions.rst shows), on two prefixes A and B of one vhost:

* ``application`` (A): channels, process-local and single-reader channels,
  groups, group expiry through its own dead-letter worker, ChannelFull,
  flush (with the ``management`` tag, as the docs say), and nothing of B;
* ``sender`` (A): ``send`` and ``send_many`` to channels that exist; a new
  channel, a receive, a group send are refused with a 403 that names the
  operation and does not read as an unreachable broker;
* ``monitoring`` (A): the statistics through the management API; it
  cannot publish or read a message, over AMQP or over HTTP.
"""

import json
import secrets
import subprocess
import sys
import time
import urllib.error
import uuid
from urllib.parse import quote, urlsplit, urlunsplit

import pika
import pytest

from asgi_amqp import AMQPChannelLayer, BrokerConnectionError, BrokerOperationError, permissions
from helpers import Management, drain, wait_until

pytestmark = [pytest.mark.slow]

EXPIRY = 2.0
GROUP_EXPIRY = 2.0


def _with_user(url, user, password):
    parts = urlsplit(url)
    netloc = "%s:%s@%s" % (quote(user, safe=""), quote(password, safe=""), parts.hostname)
    if parts.port:
        netloc += ":%d" % parts.port
    return urlunsplit(parts._replace(netloc=netloc))


class User(object):
    """A broker user with one role's permissions on one prefix, made through the management API."""

    def __init__(self, broker, api, prefix, role, extra_tags=(), read=None):
        self.name = "%s-%s" % (role, uuid.uuid4().hex[:8])
        self.password = secrets.token_hex(8)
        self.prefix = prefix
        tags = permissions.TAGS[role] + tuple(extra_tags)
        api.request(
            "PUT", "users/%s" % self.name, {"password": self.password, "tags": ",".join(tags)}
        )
        configure, write, role_read = permissions.permissions(prefix, role)
        read = role_read if read is None else read
        api.request(
            "PUT",
            "permissions/%s/%s" % (api._vhost, self.name),
            {"configure": configure, "write": write, "read": read},
        )
        self.amqp_url = _with_user(broker.amqp_url, self.name, self.password)
        self.management_url = _with_user(broker.management_url, self.name, self.password)

    def layer(self, prefix=None, **config):
        config.setdefault("receive_timeout", 1)
        config.setdefault("operation_timeout", 5)
        return AMQPChannelLayer(
            url=self.amqp_url,
            management_url=self.management_url,
            prefix=prefix or self.prefix,
            **config,
        )


@pytest.fixture(scope="module")
def api(broker):
    return Management(broker)


@pytest.fixture(scope="module")
def prefixes():
    token = uuid.uuid4().hex[:8]
    return "pa-%s" % token, "pb-%s" % token


@pytest.fixture(scope="module")
def users(broker, api, prefixes):
    a, b = prefixes
    made = {
        "app": User(broker, api, a, "application", extra_tags=("management",)),
        "app_b": User(broker, api, b, "application", extra_tags=("management",)),
        "sender": User(broker, api, a, "sender"),
        "monitor": User(broker, api, a, "monitoring"),
        # The application's permissions with reading taken away: a misconfigured user.
        "no_read": User(broker, api, a, "application", read="^$"),
    }
    yield made
    for user in made.values():
        api.request("DELETE", "users/%s" % user.name)


@pytest.fixture
def layers():
    """layers.add(layer) -> layer; all closed after the test."""

    class Layers(list):
        def add(self, layer):
            self.append(layer)
            return layer

    made = Layers()
    yield made
    for layer in reversed(made):
        layer.close()


def _refused(call, *args):
    """The BrokerOperationError that ``call`` raised: a 403, never a connection error."""
    with pytest.raises(BrokerOperationError) as caught:
        call(*args)
    error = caught.value
    assert not isinstance(error, BrokerConnectionError)
    assert error.reply_code == 403, error
    text = str(error)
    assert "ACCESS_REFUSED" in text and "permissions" in text, text
    assert "reach" not in text and "lost" not in text, text
    return text


def _blocking_receive_refused(layer, channel):
    """A blocking receive the broker refuses raises its 403, naming the queue,
    at once: waiting cannot make the permission appear. (It used to return
    nothing at its timeout, as for a queue whose node is down.)"""
    queue = layer.topology.channel_queue(channel)
    started = time.monotonic()
    with pytest.raises(BrokerOperationError) as refused:
        layer.receive([channel], block=True)
    assert refused.value.reply_code == 403 and queue in str(refused.value), refused.value
    assert "permissions" in str(refused.value)
    assert time.monotonic() - started < layer.receive_timeout + 2


def test_a_user_who_may_not_read_gets_the_403_from_a_blocking_receive(users, layers):
    """The queue declare passes (configure) and basic.consume is refused
    (read): the receive raises, and the same layer's sends still work."""
    app = layers.add(users["app"].layer())
    app.receive(["unreadable"])  # the channel's queue exists
    app.send("unreadable", {"n": 1})
    layer = layers.add(users["no_read"].layer())
    _blocking_receive_refused(layer, "unreadable")
    _blocking_receive_refused(layer, "unreadable")  # again, as promptly
    layer.send("unreadable", {"n": 2})
    assert [m["n"] for _, m in drain(app, ["unreadable"])] == [1, 2]


# -- application --------------------------------------------------------------------------------


def test_application_sends_receives_and_uses_groups(users, layers):
    layer = layers.add(users["app"].layer(expiry=EXPIRY, group_expiry=GROUP_EXPIRY, capacity=3))
    layer.send("work", {"n": 1})
    assert layer.receive(["work"]) == ("work", {"n": 1})
    reply = layer.new_channel("reply?")
    layer.send(reply, {"n": 2})
    assert layer.receive([reply], block=True) == (reply, {"n": 2})
    local = "daphne.response.p1!" + uuid.uuid4().hex[:12]
    layer.send(local, {"n": 3})
    assert layer.receive(["daphne.response.p1!"], block=True) == (local, {"n": 3})
    layer.group_add("room", "member")
    layer.group_add("room", local)
    assert sorted(layer.group_channels("room")) == sorted(["member", local])
    layer.send_group("room", {"to": "room"})
    assert layer.receive(["member"], block=True) == ("member", {"to": "room"})
    assert layer.receive(["daphne.response.p1!"], block=True) == (local, {"to": "room"})
    layer.group_discard("room", local)
    assert layer.group_channels("room") == ["member"]
    for n in range(3):
        layer.send("full", {"n": n})
    with pytest.raises(layer.ChannelFull):
        layer.send("full", {"n": 3})
    assert len(drain(layer, ["full"])) == 3


def test_application_memberships_expire_through_its_own_worker(users, layers):
    layer = layers.add(users["app"].layer(expiry=EXPIRY, group_expiry=GROUP_EXPIRY))
    layer.group_add("lapsing", "leaver")
    assert layer.group_channels("lapsing") == ["leaver"]
    wait_until(
        lambda: layer.group_channels("lapsing") == [],
        GROUP_EXPIRY + 8,
        interval=0.2,
        message="membership expired by the restricted user's dead-letter worker",
    )


def test_application_flushes_its_prefix_and_cannot_touch_the_other(users, layers, api, prefixes):
    a, b = prefixes
    layer_a = layers.add(users["app"].layer(expiry=30))
    layer_b = layers.add(users["app_b"].layer(expiry=30))
    layer_b.send("private", {"secret": "b"})
    layer_b.group_add("room", "b-member")
    objects_b = api.objects(b + ":")
    assert {b + ":q:private", b + ":g:room"} <= objects_b
    # A's user naming B's prefix: no receive, no group send, no flush.
    intruder = layers.add(users["app"].layer(prefix=b))
    text = _refused(intruder.receive, ["private"])
    assert "'%s:q:private'" % b in text, text
    _refused(intruder.send_group, "room", {"x": 1})
    _refused(intruder.flush)
    _refused(intruder.group_add, "room", "a-member")
    assert api.objects(b + ":") == objects_b
    assert layer_b.receive(["private"]) == ("private", {"secret": "b"})
    # A flushes its own prefix; B's objects stay.
    layer_a.send("mine", {"n": 1})
    layer_a.group_add("room", "a-member")
    layer_a.flush()
    assert api.objects(a + ":") <= layer_a.topology.infrastructure()
    assert {b + ":q:private", b + ":g:room"} <= api.objects(b + ":")


def test_a_prefix_in_the_same_vhost_can_send_into_another(users, layers, prefixes):
    """What the docs warn about: the default exchange reaches every queue of a vhost.

    RabbitMQ checks a publish to the default exchange as write on
    ``amq.default`` only, so A's user can add messages to B's channels
    that exist (not create new ones). A vhost per application prevents it.
    """
    _, b = prefixes
    layer_b = layers.add(users["app_b"].layer(expiry=30))
    layer_b.receive(["inbox"])  # the queue exists
    intruder = layers.add(users["app"].layer(prefix=b))
    intruder.send("inbox", {"from": "a"})
    assert layer_b.receive(["inbox"], block=True) == ("inbox", {"from": "a"})
    text = _refused(intruder.send, "brand-new", {"from": "a"})
    assert "queue_declare '%s:q:brand-new'" % b in text, text


# -- sender -------------------------------------------------------------------------------------


def test_sender_sends_to_channels_that_exist(users, layers):
    app = layers.add(users["app"].layer(expiry=30))
    app.receive(["jobs"])  # a worker listening declares the channel's queue
    app.receive(["daphne.response.p2!"])
    sender = layers.add(users["sender"].layer(expiry=30, dead_letter_worker=False))
    local = "daphne.response.p2!" + uuid.uuid4().hex[:12]
    sender.send("jobs", {"n": 0})
    outcomes = sender.send_many([("jobs", {"n": n}) for n in range(1, 50)] + [(local, {"n": 50})])
    assert outcomes == [None] * 50
    received = drain(app, ["jobs"])
    assert [message["n"] for _, message in received] == list(range(50))
    assert app.receive(["daphne.response.p2!"]) == (local, {"n": 50})


def test_sender_cannot_create_channels_receive_or_use_groups(users, layers):
    app = layers.add(users["app"].layer(expiry=30))
    app.receive(["known"])
    sender = layers.add(users["sender"].layer(expiry=30, dead_letter_worker=False))
    prefix = sender.topology.prefix
    text = _refused(sender.send, "unknown", {"n": 1})
    assert "queue_declare '%s:q:unknown'" % prefix in text, text
    outcomes = sender.send_many([("known", {"n": 1}), ("unknown", {"n": 2}), ("known", {"n": 3})])
    assert outcomes[0] is None and outcomes[2] is None
    assert isinstance(outcomes[1], BrokerOperationError) and outcomes[1].reply_code == 403
    assert [m["n"] for _, m in drain(app, ["known"])] == [1, 3]
    app.send("known", {"n": 4})
    _refused(sender.receive, ["known"])
    _blocking_receive_refused(sender, "known")
    _refused(sender.send_group, "room", {"n": 5})
    _refused(sender.group_add, "room", "known")
    assert app.receive(["known"]) == ("known", {"n": 4})  # still there


def test_sender_cli_names_the_refusal(users, layers, tmp_path):
    app = layers.add(users["app"].layer(expiry=30))
    app.receive(["cron"])
    user = users["sender"]
    env = {"AMQP_URL": user.amqp_url, "AMQP_MANAGEMENT_URL": user.management_url}

    def cli(*args, stdin=None):
        return subprocess.run(
            [sys.executable, "-m", "asgi_amqp", "--prefix", user.prefix, "--expiry", "30"]
            + list(args),
            env=dict(env, PATH="/usr/bin:/bin"),
            input=stdin,
            capture_output=True,
            text=True,
            timeout=60,
            cwd=str(tmp_path),  # where a send from stdin writes its rejects
        )

    sent = cli("send", "cron", '{"n": 1}')
    assert sent.returncode == 0, sent.stderr
    assert app.receive(["cron"]) == ("cron", {"n": 1})
    refused = cli("send", "nobody-made-this", '{"n": 2}')
    assert refused.returncode == 1  # an operation the broker refused, not a connection error
    assert "403" in refused.stderr and "ACCESS_REFUSED" in refused.stderr, refused.stderr
    assert "cannot reach" not in refused.stderr, refused.stderr
    assert user.password not in refused.stderr + refused.stdout
    # Bulk mode: the line to a channel nobody made fails, with the same reason; the rest go.
    lines = "".join(
        json.dumps({"channel": name, "message": {"n": n}}) + "\n"
        for n, name in enumerate(["cron", "nobody-made-this", "cron"])
    )
    bulk = cli("send", "--from", "-", "--on-full", "skip", stdin=lines)
    assert bulk.returncode == 1, bulk.stderr
    assert "line 2:" in bulk.stderr and "403 ACCESS_REFUSED" in bulk.stderr, bulk.stderr
    assert "cannot reach" not in bulk.stderr, bulk.stderr
    assert "sent 2, refused 1, in doubt 0, not sent 0," in bulk.stderr, bulk.stderr
    assert [m["n"] for _, m in drain(app, ["cron"])] == [0, 2]
    # A group send needs more than the role has: said in the role's terms.
    group = cli("send-group", "room", '{"n": 3}')
    assert group.returncode == 1, group.stderr
    assert "this user may not send to groups" in group.stderr, group.stderr
    assert "'sender' role" in group.stderr and group.stderr.count("\n") == 1


# -- monitoring ---------------------------------------------------------------------------------


def test_monitoring_reads_statistics_and_nothing_else(users, layers, broker):
    app = layers.add(users["app"].layer(expiry=30))
    app.send("watched", {"n": 1})
    monitor = layers.add(users["monitor"].layer(expiry=30, dead_letter_worker=False))
    wait_until(
        lambda: monitor.channel_statistics("watched")["messages_pending"] == 1,
        15,
        interval=0.5,
        message="the monitoring user sees the channel's depth",
    )
    assert monitor.global_statistics()["messages_pending"] == 1
    user = users["monitor"]
    stats = subprocess.run(
        [sys.executable, "-m", "asgi_amqp", "--prefix", user.prefix, "stats", "--json"],
        env={
            "AMQP_URL": user.amqp_url,
            "AMQP_MANAGEMENT_URL": user.management_url,
            "PATH": "/usr/bin:/bin",
        },
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert stats.returncode == 0, stats.stderr
    assert json.loads(stats.stdout)["channels"]["watched"]["messages_pending"] == 1
    # No AMQP publish or read ...
    text = _refused(monitor.send, "watched", {"n": 2})
    assert "basic_publish" in text and "amq.default" in text, text
    _refused(monitor.receive, ["watched"])
    # ... and none through the management API either.
    as_monitor = Management(_Broker(user.amqp_url, user.management_url))
    queue = app.topology.channel_queue("watched")
    for path, body in (
        ("queues/%s/%s/get" % (as_monitor._vhost, quote(queue, safe="")), _GET),
        ("exchanges/%s/amq.default/publish" % as_monitor._vhost, _publish_body(queue)),
    ):
        with pytest.raises(urllib.error.HTTPError) as refused:
            as_monitor.request("POST", path, body)
        # The API answers 401 (get) or 400 (publish), with the broker's 403 as the reason.
        assert "ACCESS_REFUSED" in refused.value.read().decode("utf8"), path
    assert app.receive(["watched"]) == ("watched", {"n": 1})  # untouched


class _Broker(object):
    def __init__(self, amqp_url, management_url):
        self.amqp_url = amqp_url
        self.management_url = management_url


_GET = {"count": 1, "ackmode": "ack_requeue_true", "encoding": "auto"}


def _publish_body(queue):
    return {"properties": {}, "routing_key": queue, "payload": "x", "payload_encoding": "string"}


def test_monitoring_user_cannot_use_amqp_at_all(users):
    connection = pika.BlockingConnection(pika.URLParameters(users["monitor"].amqp_url))
    try:
        channel = connection.channel()
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as refused:
            channel.queue_declare("%s:q:anything" % users["monitor"].prefix, durable=True)
        assert refused.value.reply_code == 403
    finally:
        if connection.is_open:
            connection.close()
