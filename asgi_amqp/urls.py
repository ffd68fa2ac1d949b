"""AMQP URLs: parsing into pika parameters with the layer's defaults,
deriving the management API URL, and printing them without credentials."""

import re
from typing import Iterable, List, Optional, Sequence, Union
from urllib.parse import parse_qs, quote, unquote, urlsplit

import pika

DEFAULT_HEARTBEAT = 20
DEFAULT_BLOCKED_CONNECTION_TIMEOUT = None
DEFAULT_SOCKET_TIMEOUT = 5
MANAGEMENT_PORT = 15672
MANAGEMENT_TLS_PORT = 15671


def parse_urls(
    url: Union[str, Iterable[str], None], client_name: str = "asgi_amqp"
) -> List[pika.URLParameters]:
    """One URL or a list of them -> list of pika ConnectionParameters."""
    urls = [url] if isinstance(url, str) else list(url or [])
    if not urls or not all(isinstance(u, str) and u for u in urls):
        raise ValueError("url must be an AMQP URL or a non-empty list of them")
    return [_parameters(u, client_name) for u in urls]


def _parameters(url: str, client_name: str) -> pika.URLParameters:
    parts = urlsplit(url)
    if parts.scheme not in ("amqp", "amqps"):
        raise ValueError("unsupported URL scheme %r: use amqp:// or amqps://" % parts.scheme)
    if not url[len(parts.scheme) + 1 :].startswith("//") or not parts.hostname:
        # pika reads 'amqp:/user:password@host/' as a vhost on localhost, and would print
        # the password (tests/test_credentials_never_leak.py::test_bad_url_errors_leak_no_secret).
        raise ValueError(
            "invalid AMQP URL %s: it needs '//' and a host, as in "
            "amqp://user:password@host:5672/vhost" % redact(url)
        )
    given = parse_qs(parts.query)
    parameters = None
    try:
        parameters = pika.URLParameters(url)
    except ValueError:
        pass
    if parameters is None:
        # Outside the except block: pika's message can quote part of the password, and
        # must not ride along as __context__.
        raise ValueError(
            "invalid AMQP URL %s: check the host, port and query keys, and that "
            "special characters in the user name and password are percent-encoded" % redact(url)
        )
    if "heartbeat" not in given:
        parameters.heartbeat = DEFAULT_HEARTBEAT
    if "blocked_connection_timeout" not in given:
        # Off: closing a blocked connection would not end the alarm, only the receives that go
        # on through it (test_an_alarm_blocks_sends_for_a_bounded_time_while_receives_go_on).
        parameters.blocked_connection_timeout = DEFAULT_BLOCKED_CONNECTION_TIMEOUT
    if "socket_timeout" not in given:
        parameters.socket_timeout = DEFAULT_SOCKET_TIMEOUT
    if "connection_attempts" not in given:
        parameters.connection_attempts = 1
    parameters.client_properties = {"connection_name": client_name}
    return parameters


_USERINFO = re.compile(r"^(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*:/*)(?P<user>[^:@/]*):.*@")


def redact(url: object) -> str:
    """The URL with any password replaced by ``***``.

    Everything up to the last '@' is user information: a password with an
    unencoded '/', '?' or '#', or in 'amqp:/user:password@host', is hidden too.
    """
    if not isinstance(url, str):
        return "<url>"
    return _USERINFO.sub(lambda m: "%s%s:***@" % (m.group("scheme"), m.group("user")), url, count=1)


def describe_parameters(parameters: Optional[pika.connection.Parameters]) -> str:
    """host:port/vhost for logs and errors; never the credentials."""
    if parameters is None:  # a pika connection's params before it has any
        return "<unknown broker>"
    return "%s:%s/%s" % (parameters.host, parameters.port, quote(parameters.virtual_host, safe=""))


def vhost_of(url: str) -> str:
    path = urlsplit(url).path
    return unquote(path[1:]) if len(path) > 1 else "/"


def management_url_for(url: str) -> str:
    """The management API on the same host as ``url``, with its credentials, on
    RabbitMQ's default port (https for ``amqps://``)."""
    parts = urlsplit(url)
    scheme = "https" if parts.scheme == "amqps" else "http"
    userinfo = parts.netloc.rpartition("@")[0]
    if not userinfo:
        userinfo = "guest:guest"
    host = parts.hostname or "localhost"
    if ":" in host:
        host = "[%s]" % host
    port = MANAGEMENT_TLS_PORT if scheme == "https" else MANAGEMENT_PORT
    return "%s://%s@%s:%d/" % (scheme, userinfo, host, port)


def urls_from_hosts(hosts: Union[str, Sequence[str]], url: object = None) -> List[str]:
    """``hosts`` (asgi_redis's name for the node list) as the ``url`` list."""
    if url is not None:
        raise TypeError("give the broker as 'url' or as 'hosts', not both")
    if isinstance(hosts, (str, bytes)):
        hosts = [hosts]
    hosts = list(hosts)
    if not hosts or not all(
        isinstance(host, str) and host.startswith(("amqp://", "amqps://")) for host in hosts
    ):
        raise TypeError(
            "hosts must be a list of AMQP URLs ('amqp://user:password@host:5672/vhost'); "
            "(host, port) pairs are asgi_redis's form: give the broker as 'url'"
        )
    return hosts
