"""A small client for RabbitMQ's management HTTP API, on the standard library alone.

AMQP 0-9-1 cannot list queues, exchanges or bindings: ``group_channels``, ``flush``,
statistics and ``asgi-amqp top`` read them here. Every request has a timeout, and no
error names the credentials. Before its first request a client checks, once, that the
URL serves RabbitMQ's API: a proxy or a wrong port may answer with a 404 or an HTML page,
which would read as an empty broker (test_flush_deletes_nothing_it_could_not_list).
"""

import base64
import json
import logging
import socket
import urllib.error
import urllib.request
from typing import Any, Dict, List, Mapping, Optional
from urllib.parse import quote, unquote, urlsplit

from .errors import ManagementAPIError

logger = logging.getLogger(__name__)

ENABLE_HINT = (
    "enable it with `rabbitmq-plugins enable rabbitmq_management` or pass "
    "management_url= pointing at it"
)
NOT_RABBITMQ_HINT = (
    "check management_url (RabbitMQ's management plugin listens on port 15672 by default)"
)
# Keys that only RabbitMQ's /api/overview carries.
_OVERVIEW_KEYS = ("rabbitmq_version", "management_version")
PAGE_SIZE = 500


class _NotJSON(ManagementAPIError):
    """The answer was not JSON: an HTML page, a proxy's text."""


class _Status(ManagementAPIError):
    """An error status; some checks answer with one and a JSON body (``alarms``)."""

    def __init__(self, message: str, code: int, body: bytes) -> None:
        super(_Status, self).__init__(message)
        self.code = code
        self.body = body


class ManagementClient(object):
    """The management API of one vhost: the layer's, used from callers' threads.

    Credentials in ``url`` (``http://user:password@host:15672/``) go into the
    Authorization header only; messages name the URL without them.
    """

    def __init__(self, url: str, vhost: str, timeout: float = 5.0) -> None:
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
        self._is_rabbitmq = False  # set once /api/overview proved it, never unset

    def __repr__(self) -> str:
        return "<ManagementClient %s>" % self._base

    @property
    def where(self) -> str:
        """The API's URL without credentials, for messages."""
        return self._base

    # -- requests ---------------------------------------------------------------

    def _get(self, path: str, params: Optional[Mapping[str, object]] = None) -> Any:
        """The JSON body of ``/api/<path>``, or None for a 404 (no such object)."""
        if not self._is_rabbitmq:
            self.overview()
        return self._request(path, params)

    def _request(self, path: str, params: Optional[Mapping[str, object]] = None) -> Any:
        url = "%s/api/%s" % (self._base, path)
        if params:
            url += "?" + "&".join("%s=%s" % (k, quote(str(v), safe="")) for k, v in params.items())
        request = urllib.request.Request(url, headers={"Authorization": self._auth})
        try:
            with urllib.request.urlopen(request, timeout=self._timeout) as response:
                raw = response.read()
        except urllib.error.HTTPError as exc:
            if exc.code == 404:
                return None
            if exc.code == 401:
                raise ManagementAPIError(
                    "the management API at %s refused the credentials" % self._base
                )
            try:
                body = exc.read()
            except (OSError, ValueError):  # the connection went with the error
                body = b""
            raise _Status(
                "the management API at %s answered HTTP %d" % (self._base, exc.code),
                exc.code,
                body,
            )
        except (urllib.error.URLError, socket.timeout, ConnectionError, ValueError) as exc:
            raise ManagementAPIError(
                "the RabbitMQ management API is not reachable at %s (%s); %s"
                % (self._base, getattr(exc, "reason", exc), ENABLE_HINT)
            )
        return self._json(raw)

    def _json(self, raw: bytes) -> Any:
        try:
            return json.loads(raw.decode("utf8"))
        except ValueError:  # UnicodeDecodeError is one too
            raise _NotJSON("the management API at %s did not answer JSON" % self._base) from None

    def overview(self) -> Dict[str, Any]:
        """The node's ``/api/overview`` (versions); ManagementAPIError naming the URL
        unless it is RabbitMQ's."""
        try:
            body = self._request("overview", {"columns": ",".join(_OVERVIEW_KEYS)})
        except _NotJSON:
            body, answer = None, "a page that is not JSON"
        else:
            answer = "HTTP 404" if body is None else "JSON without rabbitmq_version"
        if isinstance(body, dict) and any(body.get(key) for key in _OVERVIEW_KEYS):
            self._is_rabbitmq = True
            return body
        raise ManagementAPIError(
            "%s is not a RabbitMQ management API: /api/overview answered %s; %s"
            % (self._base, answer, NOT_RABBITMQ_HINT)
        )

    def _paged(self, path: str, name_prefix: str, columns: Optional[str]) -> List[Dict[str, Any]]:
        """Every item under ``path`` whose name starts with ``name_prefix``."""
        _check_name_prefix(name_prefix)
        params = {
            "page_size": PAGE_SIZE,
            "name": "^" + _regex_escape(name_prefix),
            "use_regex": "true",
        }
        if columns:
            params["columns"] = columns
        items: List[Dict[str, Any]] = []
        page = 1
        while True:
            try:
                body = self._get(path, dict(params, page=page))
            except ManagementAPIError:
                if page == 1:
                    raise
                # Objects went meanwhile: the API answers 400 past the last page.
                return items
            if body is None:
                return items
            items.extend(body.get("items", []))
            if page >= body.get("page_count", 1):
                return items
            page += 1

    # -- what the layer asks ----------------------------------------------------

    def queue_names(self, prefix: str) -> List[str]:
        return [q["name"] for q in self._paged("queues/%s" % self._vhost, prefix, "name")]

    def exchange_names(self, prefix: str) -> List[str]:
        return [x["name"] for x in self._paged("exchanges/%s" % self._vhost, prefix, "name")]

    def exchange_bindings_from(self, exchange: str) -> List[Dict[str, Any]]:
        """The bindings of ``exchange`` as source: ``destination``,
        ``destination_type`` and ``arguments``."""
        body = self._get(
            "exchanges/%s/%s/bindings/source" % (self._vhost, quote(exchange, safe=""))
        )
        return list(body or [])

    def exchange_bindings_to(self, exchange: str) -> List[Dict[str, Any]]:
        """The bindings of ``exchange`` as destination: ``source`` and ``arguments``."""
        body = self._get(
            "exchanges/%s/%s/bindings/destination" % (self._vhost, quote(exchange, safe=""))
        )
        return list(body or [])

    def queue(self, name: str) -> Optional[Dict[str, Any]]:
        return self._get("queues/%s/%s" % (self._vhost, quote(name, safe="")))

    def queues(self, prefix: str, columns: Optional[str] = None) -> List[Dict[str, Any]]:
        """Queue records (depth, rates, arguments) whose name starts with ``prefix``;
        ``columns`` (``"name,messages"``) keeps only those fields."""
        return self._paged("queues/%s" % self._vhost, prefix, columns)

    def exchanges(self, prefix: str, columns: Optional[str] = None) -> List[Dict[str, Any]]:
        """Exchange records (with their publish rates) whose name starts with ``prefix``."""
        return self._paged("exchanges/%s" % self._vhost, prefix, columns)

    def exchange_bindings(self, source_prefix: str) -> List[Dict[str, Any]]:
        """The vhost's bindings whose source starts with ``source_prefix``: all of them
        in one request, since the API cannot filter bindings."""
        body = self._get(
            "bindings/%s" % self._vhost,
            {"columns": "source,destination,destination_type,arguments"},
        )
        return [b for b in body or [] if str(b.get("source", "")).startswith(source_prefix)]

    def alarms(self) -> Optional[List[Dict[str, str]]]:
        """The cluster's resource alarms, one ``{"node": ..., "resource": ...}`` each;
        None without the alarms check (RabbitMQ before 3.8.10).

        ``health/checks/alarms`` answers 503 listing them, 200 when there is none
        (test_a_resource_alarm_is_served_while_it_lasts); the ``management`` tag suffices.
        """
        try:
            body = self._get("health/checks/alarms")
        except _Status as exc:
            if exc.code != 503:
                raise
            body = self._json(exc.body)
        if not isinstance(body, dict):
            return None
        found = body.get("alarms") or []
        return [
            {"node": str(alarm.get("node", "")), "resource": str(alarm.get("resource", ""))}
            for alarm in found
            if isinstance(alarm, dict)
        ]


def _check_name_prefix(name_prefix: object) -> None:
    """An empty prefix would list every object of the vhost: never what a caller means."""
    if not isinstance(name_prefix, str) or not name_prefix:
        raise ValueError("a name prefix is needed to list queues or exchanges")


def _regex_escape(text: str) -> str:
    return "".join("\\" + c if c in ".^$*+?{}[]\\|()" else c for c in text)
