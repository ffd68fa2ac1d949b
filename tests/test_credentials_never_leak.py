"""Passwords never show up in logs (the layer's or pika's), errors or reprs.

Every log record of every logger is captured at DEBUG while layers fail to
connect (closed port, wrong password) and while one with a secret password
works normally, and the secret is looked for in each record's message,
arguments and formatted exception, in every exception the caller sees (str
and repr along the whole __cause__/__context__ chain, and the formatted
traceback), and in repr(layer).
"""

import base64
import logging
import time
import traceback
import urllib.error
import uuid
from urllib.parse import quote, urlsplit

import pytest

import asgi_amqp
from asgi_amqp import AMQPChannelLayer
from asgi_amqp.urls import describe_parameters, parse_urls, redact
from helpers import Management, free_port, wait_until

SECRET = "s3cr3tPassw0rd"
PREFIX = "t-cred-%s" % uuid.uuid4().hex[:8]


# -- helpers ------------------------------------------------------------------------------------


def forbidden(secret, user="guest"):
    """The forms a leaked secret could take."""
    token = base64.b64encode(("%s:%s" % (user, secret)).encode("utf8")).decode("ascii")
    return {secret, quote(secret, safe=""), token}


def exception_texts(exc):
    texts = ["".join(traceback.format_exception(type(exc), exc, exc.__traceback__))]
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        texts += [str(exc), repr(exc), repr(exc.args)]
        exc = exc.__cause__ or exc.__context__
    return texts


def record_texts(record):
    texts = [record.getMessage(), repr(record.msg), repr(record.args)]
    if record.exc_info and record.exc_info[1] is not None:
        texts += exception_texts(record.exc_info[1])
    if record.exc_text:
        texts.append(record.exc_text)
    if record.stack_info:
        texts.append(record.stack_info)
    return texts


def assert_no_leak(secrets, caplog=None, errors=(), objects=()):
    places = []
    if caplog is not None:
        places.append(("caplog.text", caplog.text))
        for record in caplog.records:
            for text in record_texts(record):
                places.append(("log record %s:%s" % (record.name, record.lineno), text))
    for exc in errors:
        for text in exception_texts(exc):
            places.append(("exception %s" % type(exc).__name__, text))
    for obj in objects:
        places += [("repr", repr(obj)), ("str", str(obj))]
    leaks = [(where, text[:300]) for where, text in places for s in secrets if s in text]
    assert not leaks, leaks


def catch(call, exc_type):
    started = time.monotonic()
    with pytest.raises(exc_type) as info:
        call()
    assert time.monotonic() - started < 5.0
    return info.value


def exercise_failing_layer(layer):
    """Every kind of call, each failing; returns the exceptions raised."""
    errors = [
        catch(lambda: layer.send("cred.channel", {"a": 1}), asgi_amqp.BrokerConnectionError),
        catch(lambda: layer.send("cred.channel", {"a": 1}), asgi_amqp.BrokerConnectionError),
        catch(lambda: layer.receive(["cred.channel"]), asgi_amqp.BrokerConnectionError),
        catch(lambda: layer.receive(["cred.channel"], block=True), asgi_amqp.BrokerConnectionError),
        catch(
            lambda: layer.group_add("cred-group", "cred.channel"), asgi_amqp.BrokerConnectionError
        ),
        catch(layer.flush, asgi_amqp.ManagementAPIError),
        catch(lambda: layer.group_channels("cred-group"), asgi_amqp.ManagementAPIError),
    ]
    return errors


def _logged(caplog, logger, text):
    return any(r.name == logger and text in r.getMessage() for r in caplog.records)


def with_credentials(url, user, password):
    parts = urlsplit(url)
    host = parts.hostname if ":" not in parts.hostname else "[%s]" % parts.hostname
    netloc = "%s:%s@%s:%d" % (quote(user, safe=""), quote(password, safe=""), host, parts.port)
    return parts._replace(netloc=netloc).geturl()


# -- failing to connect -----------------------------------------------------------------------


def test_closed_port_leaks_no_secret(caplog):
    caplog.set_level(logging.DEBUG)
    port, management_port = free_port(), free_port()
    layer = AMQPChannelLayer(
        url="amqp://guest:%s@127.0.0.1:%d/%%2F" % (SECRET, port),
        management_url="http://guest:%s@127.0.0.1:%d/" % (SECRET, management_port),
        prefix=PREFIX,
        operation_timeout=3,
        first_connect_timeout=0,  # every call fails (the wait's own texts: test_first_connection_*)
    )
    try:
        errors = exercise_failing_layer(layer)
        for error in errors[:5]:
            assert not isinstance(error, asgi_amqp.AuthenticationError)
        wait_until(
            lambda: _logged(caplog, "asgi_amqp.engine.deadletter", "dead-letter worker"),
            5,
            interval=0.02,
            message="a failed dead-letter worker connection",
        )
    finally:
        layer.close()
    assert any(r.name.startswith("pika") for r in caplog.records), "pika's logs were not captured"
    assert_no_leak(forbidden(SECRET), caplog, errors, [layer])


def test_wrong_password_on_the_real_broker_leaks_no_secret(broker, caplog):
    caplog.set_level(logging.DEBUG)
    layer = AMQPChannelLayer(
        url=with_credentials(broker.amqp_url, "guest", SECRET),
        management_url=with_credentials(broker.management_url, "guest", SECRET),
        prefix=PREFIX,
        operation_timeout=3,
    )
    try:
        errors = exercise_failing_layer(layer)
        for error in errors[:5]:
            assert isinstance(error, asgi_amqp.AuthenticationError), repr(error)
        assert "credentials" in str(errors[-1])  # the management API's 401
        wait_until(
            lambda: _logged(caplog, "asgi_amqp.engine.deadletter", "AuthenticationError"),
            5,
            interval=0.02,
            message="a refused dead-letter worker connection",
        )
    finally:
        layer.close()
    assert any("ACCESS_REFUSED" in r.getMessage() for r in caplog.records), (
        "pika's record of the refusal was not captured"
    )
    assert_no_leak(forbidden(SECRET), caplog, errors, [layer])


@pytest.mark.parametrize(
    "password",
    [
        "p@ss:w/rd?#%&",
        "\u00e9t\u00e9-\U0001f600-s3cr3t",
        "with space s3cr3t",
    ],
)
def test_passwords_with_reserved_characters_leak_nowhere(caplog, password):
    """Percent-encoded in the URL as they must be; neither form may appear."""
    caplog.set_level(logging.DEBUG)
    url = "amqp://guest:%s@127.0.0.1:%d/%%2F" % (quote(password, safe=""), free_port())
    layer = AMQPChannelLayer(
        url=url,
        prefix=PREFIX,
        operation_timeout=0.3,
        management_url="http://127.0.0.1:%d/" % free_port(),
    )
    try:
        assert parse_urls(url)[0].credentials.password == password  # decoded correctly
        errors = [catch(lambda: layer.send("cred.channel", {}), asgi_amqp.BrokerConnectionError)]
    finally:
        layer.close()
    assert_no_leak(forbidden(password) | {quote(password)}, caplog, errors, [layer])


# -- bad configuration ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "url",
    [
        "amqp://guest:%s@127.0.0.1:notaport/%%2F" % SECRET,
        "amqp://guest:%s@127.0.0.1:99999/%%2F" % SECRET,
        "amqp://guest:%s@127.0.0.1/%%2F?heartbeat=often" % SECRET,
        "amqp://guest:%s@127.0.0.1/%%2F?no_such_option=1" % SECRET,
        "amqp://guest:%s@127.0.0.1/%%2F?ssl_options=nonsense" % SECRET,
        "amqp://guest:%s@[::1/%%2F" % SECRET,
        "http://guest:%s@127.0.0.1:5672/" % SECRET,
        "redis://:%s@127.0.0.1:6379/0" % SECRET,
        # One slash or none: pika would read the credentials as a vhost on
        # localhost, connect there and print them in its refusal.
        "amqp:/deploy:%s@127.0.0.1:52917/%%2F" % SECRET,
        "amqp:deploy:%s@127.0.0.1:52917/%%2F" % SECRET,
        "amqps:/deploy:%s@127.0.0.1/%%2F" % SECRET,
    ],
)
def test_bad_url_errors_leak_no_secret(caplog, url):
    caplog.set_level(logging.DEBUG)
    started = time.monotonic()
    with pytest.raises(ValueError) as info:
        AMQPChannelLayer(url=url)
    assert time.monotonic() - started < 1.0  # refused before any connection attempt
    assert_no_leak(forbidden(SECRET), caplog, [info.value])


@pytest.mark.parametrize("separator", ["/", "?", "#"])
def test_unencoded_reserved_characters_in_the_password_leak_nowhere(caplog, separator):
    caplog.set_level(logging.DEBUG)
    password = "s3cr3t%sPassw0rd" % separator
    with pytest.raises(ValueError) as info:
        AMQPChannelLayer(url="amqp://guest:%s@127.0.0.1:5672/%%2F" % password)
    assert_no_leak({"s3cr3t", password}, caplog, [info.value])


def test_bad_management_url_leaks_no_secret(broker, caplog):
    caplog.set_level(logging.DEBUG)
    # Refused by the constructor, before any call can use it.
    with pytest.raises(ValueError) as info:
        AMQPChannelLayer(
            url=broker.amqp_url,
            prefix=PREFIX,
            dead_letter_worker=False,
            management_url="ftp://guest:%s@127.0.0.1/" % SECRET,
        )
    assert_no_leak(forbidden(SECRET), caplog, [info.value], [])


# -- working normally ---------------------------------------------------------------------------


@pytest.fixture
def secret_user(broker):
    """A broker user whose password is a secret; deleted afterwards."""
    user, password = "t-cred-%s" % uuid.uuid4().hex[:8], "Us3r-" + SECRET + "-" + uuid.uuid4().hex
    api = Management(broker)
    api.request("PUT", "users/%s" % user, {"password": password, "tags": "management"})
    api.request(
        "PUT",
        "permissions/%s/%s" % (quote(api.vhost, safe=""), user),
        {"configure": ".*", "write": ".*", "read": ".*"},
    )
    yield user, password
    try:
        api.request("DELETE", "users/%s" % user)
    except urllib.error.HTTPError:
        pass


def test_a_working_layer_logs_no_secret(broker, caplog, secret_user):
    user, password = secret_user
    caplog.set_level(logging.DEBUG)
    layer = AMQPChannelLayer(
        url=with_credentials(broker.amqp_url, user, password),
        management_url=with_credentials(broker.management_url, user, password),
        prefix=PREFIX + "-ok",
        receive_timeout=1,
    )
    try:
        layer.send("cred.ok", {"a": 1})
        assert layer.receive(["cred.ok"]) == ("cred.ok", {"a": 1})
        layer.group_add("cred-group", "cred.ok")
        assert layer.group_channels("cred-group") == ["cred.ok"]
        layer.send_group("cred-group", {"b": 2})
        assert layer.receive(["cred.ok"], block=True) == ("cred.ok", {"b": 2})
        layer.group_discard("cred-group", "cred.ok")
        layer.flush()
        assert layer.threads()
    finally:
        layer.close()
    assert any(r.name.startswith("pika") and r.levelno == logging.DEBUG for r in caplog.records), (
        "pika's debug logs were not captured"
    )
    assert_no_leak(forbidden(password, user), caplog, [], [layer])


# -- repr and redact -----------------------------------------------------------------------------


def test_repr_of_the_layer_shows_hosts_but_no_password():
    layer = AMQPChannelLayer(
        url=[
            "amqp://guest:%s@rabbit-1:5672/%%2F" % SECRET,
            "amqps://admin:%s@rabbit-2:5671/prod" % quote(SECRET + "@x"),
            "amqp://rabbit-3/",
        ],
        prefix="cred-repr",
    )
    text = repr(layer)
    assert "rabbit-1:5672" in text and "rabbit-2:5671" in text and "rabbit-3" in text
    assert "guest" in text and "admin" in text and "cred-repr" in text
    assert_no_leak(
        forbidden(SECRET) | forbidden(SECRET + "@x", "admin") | {quote(SECRET + "@x")},
        objects=[layer],
    )
    for parameters in parse_urls(layer._urls):
        assert SECRET not in describe_parameters(parameters)
    layer.close()


@pytest.mark.parametrize(
    "url, expected",
    [
        ("amqp://guest:s3cr3t@host:5672/%2F", "amqp://guest:***@host:5672/%2F"),
        (
            "amqps://u:s3cr3t@host/vhost?heartbeat=10&x=y",
            "amqps://u:***@host/vhost?heartbeat=10&x=y",
        ),
        ("amqp://u:s3cr3t@[::1]:5672/v", "amqp://u:***@[::1]:5672/v"),
        ("amqp://u:p%40s%3As3cr3t%2F@host/", "amqp://u:***@host/"),
        ("amqp://u:p@s3cr3t@host/", "amqp://u:***@host/"),
        ("amqp://:s3cr3t@host/", "amqp://:***@host/"),
        ("amqp://u:@host/", "amqp://u:***@host/"),
        ("http://guest:s3cr3t@host:15672/", "http://guest:***@host:15672/"),
        ("amqp://guest@host/", "amqp://guest@host/"),
        ("amqp://host:5672/%2F", "amqp://host:5672/%2F"),
        ("amqp://", "amqp://"),
        ("amqp:/deploy:s3cr3t@127.0.0.1:52917/%2F", "amqp:/deploy:***@127.0.0.1:52917/%2F"),
        ("amqp:deploy:s3cr3t@host/", "amqp:deploy:***@host/"),
    ],
)
def test_redact(url, expected):
    assert redact(url) == expected
    assert "s3cr3t" not in redact(url)
    assert redact(redact(url)) == redact(url)
