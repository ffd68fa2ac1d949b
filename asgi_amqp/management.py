"""A small client for RabbitMQ's management HTTP API.

AMQP 0-9-1 cannot list queues, exchanges or bindings, so ``group_channels``,
``flush`` and statistics come from here. Only the standard library is used;
every request has a timeout, and errors never include the credentials.
"""

import base64
import json
import logging
import socket
import urllib.error
import urllib.request
from urllib.parse import quote, unquote, urlsplit

from .errors import ManagementAPIError

logger = logging.getLogger(__name__)

ENABLE_HINT = (
    "enable it with `rabbitmq-plugins enable rabbitmq_management` or pass "
    "management_url= pointing at it"
)


class ManagementClient(object):
    def __init__(self, url, vhost, timeout=5.0):
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https"):
            raise ValueError("management_url must be an http:// or https:// URL")
        self._base = "%s://%s%s" % (
            parts.scheme,
            parts.netloc.rpartition("@")[2],
            parts.path.rstrip("/"),
        )
        user = unquote(parts.username or "guest")
        password = unquote(parts.password or "guest")
        token = base64.b64encode(("%s:%s" % (user, password)).encode("utf8")).decode("ascii")
        self._auth = "Basic " + token
        self._vhost = quote(vhost, safe="")
        self._timeout = timeout

    def __repr__(self):
        return "<ManagementClient %s>" % self._base

    def _get(self, path, params=None):
        url = "%s/api/%s" % (self._base, path)
        if params:
            url += "?" + "&".join("%s=%s" % (k, quote(str(v), safe="")) for k, v in params.items())
        request = urllib.request.Request(url, headers={"Authorization": self._auth})
        try:
            with urllib.request.urlopen(request, timeout=self._timeout) as response:
                return json.loads(response.read().decode("utf8"))
        except urllib.error.HTTPError as exc:
            if exc.code == 404:
                return None
            if exc.code == 401:
                raise ManagementAPIError(
                    "the management API at %s refused the credentials" % self._base
                )
            raise ManagementAPIError(
                "the management API at %s answered HTTP %d" % (self._base, exc.code)
            )
        except (urllib.error.URLError, socket.timeout, ConnectionError, ValueError) as exc:
            raise ManagementAPIError(
                "the RabbitMQ management API is not reachable at %s (%s); %s"
                % (self._base, getattr(exc, "reason", exc), ENABLE_HINT)
            )

    def _paged(self, path, name_prefix):
        """All items under ``path`` whose name starts with ``name_prefix``."""
        _check_name_prefix(name_prefix)
        items, page = [], 1
        while True:
            body = self._get(
                path,
                {
                    "page": page,
                    "page_size": 500,
                    "name": "^" + _regex_escape(name_prefix),
                    "use_regex": "true",
                    "columns": "name",
                },
            )
            if body is None:
                return items
            items.extend(item["name"] for item in body.get("items", []))
            if page >= body.get("page_count", 1):
                return items
            page += 1

    def ping(self):
        self._get("overview")

    def queue_names(self, prefix):
        return self._paged("queues/%s" % self._vhost, prefix)

    def exchange_names(self, prefix):
        return self._paged("exchanges/%s" % self._vhost, prefix)

    def exchange_destinations(self, exchange):
        """Names of the exchanges bound from ``exchange`` (its bindings as source)."""
        body = self._get(
            "exchanges/%s/%s/bindings/source" % (self._vhost, quote(exchange, safe=""))
        )
        return [b["destination"] for b in body or [] if b.get("destination_type") == "exchange"]

    def queue(self, name):
        return self._get("queues/%s/%s" % (self._vhost, quote(name, safe="")))

    def queues(self, prefix):
        """Full queue records (depth, rates) for the layer's queues."""
        _check_name_prefix(prefix)
        items, page = [], 1
        while True:
            body = self._get(
                "queues/%s" % self._vhost,
                {
                    "page": page,
                    "page_size": 500,
                    "name": "^" + _regex_escape(prefix),
                    "use_regex": "true",
                },
            )
            if body is None:
                return items
            items.extend(body.get("items", []))
            if page >= body.get("page_count", 1):
                return items
            page += 1


def _check_name_prefix(name_prefix):
    """An empty prefix would list every object of the vhost: never what a caller means."""
    if not isinstance(name_prefix, str) or not name_prefix:
        raise ValueError("a name prefix is needed to list queues or exchanges")


def _regex_escape(text):
    return "".join("\\" + c if c in ".^$*+?{}[]\\|()" else c for c in text)
