"""``asgi-amqp metrics``: the prefix's figures over HTTP for Prometheus.

The figures are ``asgi-amqp top``'s (``tools.snapshot``) and the broker's
alarms, turned into metric families by ``tools.metrics`` and read at most
every ``--refresh`` seconds (``tools.metrics_refresh``). It needs
``prometheus_client``, an extra: ``pip install 'asgi-amqp-layer[metrics]'``;
it is imported when the command runs, so the other commands start without it.

The first look happens before serving: settings or a management API that
is wrong end the command at once, with one line and exit status 2, as for
``top``. Later failures are served as ``asgi_amqp_up 0`` and logged once per
outage. Ctrl-C and SIGTERM stop the server and exit 0.
"""

import signal
import threading
from types import FrameType
from typing import TYPE_CHECKING, Any, Dict, Optional, Tuple

from ..metrics_refresh import Readings
from ..snapshot import Collector
from .base import EPILOG, CLIError, _LayerErrors, cli, click
from .settings import Settings

if TYPE_CHECKING:
    from ..metrics_refresh import Alarms
    from ..snapshot import Snapshot

DEFAULT_LISTEN = "127.0.0.1:9650"
DEFAULT_REFRESH = 5.0
# The least --refresh: one look is top's three requests plus the alarms check,
# so even at this bound the management API gets fewer requests a second
# (4 / 3 s) than from one top at its default interval (3 / 2 s).
MIN_REFRESH = 3.0
MISSING = (
    "asgi-amqp metrics needs the prometheus_client package, which is not installed "
    "(%s): pip install 'asgi-amqp-layer[metrics]'"
)
WAIT_STEP = 1.0  # seconds between two checks for a stop


class _Address(click.ParamType):
    """``HOST:PORT`` (``[::1]:PORT`` for an IPv6 address); port 0 picks a free one."""

    name = "HOST:PORT"

    def convert(
        self, value: Any, param: Optional[click.Parameter], ctx: Optional[click.Context]
    ) -> Tuple[str, int]:
        if isinstance(value, tuple):
            return value
        host, sep, port = str(value).rpartition(":")
        if host.startswith("[") and host.endswith("]"):
            host = host[1:-1]
        if not sep or not host or not port.isdigit() or int(port) > 65535:
            self.fail(
                "%r is not HOST:PORT, e.g. 127.0.0.1:9650 or 0.0.0.0:9650" % value, param, ctx
            )
        return host, int(port)


def _server_module() -> Any:
    """``tools.metrics``, or a one-line error that says how to install what it needs."""
    try:
        from .. import metrics
    except ImportError as exc:
        if not (exc.name or "").startswith("prometheus_client"):
            raise
        raise CLIError(MISSING % exc) from None
    return metrics


class _StopSignals(object):
    """Ctrl-C (SIGINT) and SIGTERM set ``stopped``, from before the address
    is printed: a signal that came between that line and the wait raised
    ``KeyboardInterrupt`` outside it. Off the main thread: Ctrl-C only."""

    def __init__(self) -> None:
        self.stopped = threading.Event()
        self._previous: Dict[int, Any] = {}

    def __enter__(self) -> "_StopSignals":
        for signum in (signal.SIGINT, signal.SIGTERM):
            try:
                self._previous[signum] = signal.signal(signum, self._on_signal)
            except ValueError:  # not the main thread
                break
        return self

    def _on_signal(self, signum: int, frame: Optional[FrameType]) -> None:
        self.stopped.set()

    def wait(self) -> None:
        try:
            while not self.stopped.wait(WAIT_STEP):
                pass
        except KeyboardInterrupt:
            pass

    def __exit__(self, *exc: object) -> None:
        for signum, previous in self._previous.items():
            signal.signal(signum, previous)


@cli.command(epilog=EPILOG)
@click.option(
    "--listen",
    type=_Address(),
    default=DEFAULT_LISTEN,
    show_default=True,
    help="Address to serve on; 0.0.0.0:PORT for every interface, port 0 for a free port "
    "(the address is printed on stderr).",
)
@click.option(
    "--refresh",
    type=click.FloatRange(min=MIN_REFRESH),
    default=DEFAULT_REFRESH,
    show_default=True,
    metavar="SECONDS",
    help="Least seconds between two looks at the management API, however often it is "
    "scraped (the broker samples every 5 s by default).",
)
@click.option(
    "--filter",
    "pattern",
    metavar="GLOB",
    help="Serve only channels and groups whose name matches GLOB (e.g. 'http.*').",
)
@click.pass_obj
def metrics(
    settings: Settings, listen: Tuple[str, int], refresh: float, pattern: Optional[str]
) -> None:
    """Serve the prefix's figures over HTTP for Prometheus, until Ctrl-C or SIGTERM.

    Per ASGI channel (an ordered channel's shards summed into it, a
    process-local queue as "name!"): messages waiting and unacknowledged,
    capacity and fill, consumers, publish and delivery rates, the oldest
    message's age; groups and their members; the dead-letter backlog; the
    broker's resource alarms. One look at the management API serves every
    scrape for --refresh seconds. Needs prometheus_client: pip install
    'asgi-amqp-layer[metrics]'.
    """
    served = _server_module()
    layer = settings.layer()
    client = layer.management_client()
    collector = Collector(client, layer.topology)

    def look() -> "Tuple[Snapshot, Alarms]":
        return collector(pattern), client.alarms()

    with _LayerErrors():
        first = Readings.take(look)
    readings = Readings(look, refresh, first)
    host, port = listen
    try:
        server, thread = served.serve(readings, host, port)
    except OSError as exc:
        raise CLIError("cannot listen on %s:%d: %s" % (host, port, exc.strerror or exc)) from None
    bound_host, bound_port = server.server_address[:2]
    shown = "[%s]" % bound_host if ":" in str(bound_host) else bound_host
    try:
        with _StopSignals() as signals:
            settings.note(
                "serving the metrics of prefix %r on http://%s:%d/metrics (a look at %s at "
                "most every %g s); Ctrl-C stops"
                % (layer.topology.prefix, shown, bound_port, client.where, refresh)
            )
            signals.wait()
    finally:
        server.shutdown()
        server.server_close()
        thread.join(WAIT_STEP * 5)
