"""Two OS processes talking through asgi_amqp on one RabbitMQ broker.

    python examples/demo.py

Process A (this one) starts process B (multiprocessing, spawn) and they
exchange messages three ways:

  (i)   normal channel:        A sends "ping" to demo.ping; B receives it
                               with receive(["demo.ping"], block=True).
  (ii)  process-local channel: B replies to A's demo.reply!<id>, which A
                               receives with receive(["demo.reply!"]).
  (iii) group:                 both join demo.room with their process-local
                               channels (A: demo.reply!<id>, B: demo.b!<id>;
                               the part before "!" names a process's own
                               queue, so each process needs its own) and A
                               calls send_group; both receive it, and B tells
                               A it did.

Every hop is timed (ms, from just before the sender's ``send`` to the
receiver having the message) and printed. Every wait is bounded: a message
that does not arrive within WAIT_SECONDS ends the demo with exit status 1
and says which one. All broker objects live under a prefix unique to the
run and are deleted at the end.

The broker is $AMQP_URL (default amqp://guest:guest@127.0.0.1:5672/%2F);
$AMQP_MANAGEMENT_URL, if set, is used to list the group's members and to
flush.
"""

import multiprocessing
import os
import secrets
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

DEFAULT_URL = "amqp://guest:guest@127.0.0.1:5672/%2F"
PING_CHANNEL = "demo.ping"
GROUP = "demo.room"
WAIT_SECONDS = 10.0  # the longest any one message may take to arrive
START_SECONDS = 30.0  # the longest process B may take to start


class DemoFailure(Exception):
    pass


def make_layer(url, prefix, management_url):
    from asgi_amqp import AMQPChannelLayer

    # A short receive_timeout lets the loops below check their own deadlines.
    return AMQPChannelLayer(
        url=url,
        prefix=prefix,
        management_url=management_url,
        expiry=30,
        group_expiry=120,
        receive_timeout=1.0,
        operation_timeout=10.0,
    )


class Printer(object):
    def __init__(self, who, t0):
        self.who = "[%s pid %d]" % (who, os.getpid())
        self.t0 = t0

    def __call__(self, text):
        line = "%8.1f ms  %s  %s" % ((time.time() - self.t0) * 1000, self.who, text)
        print(line.rstrip(), flush=True)


def receive_until(layer, channels, wanted, what, timeout=WAIT_SECONDS):
    """Receive from ``channels`` until ``wanted(channel, message)``; (channel, message, at)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        channel, message = layer.receive(channels, block=True)
        if channel is None:
            continue
        if wanted(channel, message):
            return channel, message, time.time()
        print("    (ignored an unexpected message on %s: %r)" % (channel, message), flush=True)
    raise DemoFailure("%s did not arrive on %s within %.0f s" % (what, channels, timeout))


def ms(seconds):
    return seconds * 1000.0


# -- process B ------------------------------------------------------------------------


def process_b(url, prefix, management_url, me, t0, ready):
    """Join the room as ``me``, answer one ping, receive one room message, report it, leave."""
    say = Printer("B", t0)
    layer = make_layer(url, prefix, management_url)
    status = 0
    try:
        layer.group_add(GROUP, me)
        say("joined group %s as %s" % (GROUP, me))
        ready.set()

        # (i) normal channel: the ping from A.
        channel, ping, got_at = receive_until(
            layer, [PING_CHANNEL], lambda c, m: m.get("type") == "ping", "the ping from A"
        )
        hop = ms(got_at - ping["sent_at"])
        say("<- %-24s %-28s hop %6.2f ms" % (channel, "'%s' from A" % ping["text"], hop))

        # (ii) process-local channel: the reply, to A's demo.reply!<id>.
        reply_to = ping["reply_channel"]
        sent_at = time.time()
        layer.send(
            reply_to,
            {
                "type": "pong",
                "text": "pong",
                "sent_at": sent_at,
                "ping_hop_ms": hop,
                "ping_sent_at": ping["sent_at"],
                "b_channel": me,
            },
        )
        say(
            "-> %-24s %-28s send confirmed in %.2f ms"
            % (reply_to, "'pong'", ms(time.time() - sent_at))
        )

        # (iii) group: the room message arrives on B's own process-local channel.
        channel, room, got_at = receive_until(
            layer, ["demo.b!"], lambda c, m: m.get("type") == "room", "the group message"
        )
        hop = ms(got_at - room["sent_at"])
        say(
            "<- %-24s %-28s hop %6.2f ms (group %s)"
            % (channel, "'%s' from A" % room["text"], hop, GROUP)
        )
        if channel != me:
            raise DemoFailure("the group message came on %s, not %s" % (channel, me))
        layer.send(
            reply_to, {"type": "room-ack", "hop_ms": hop, "b_channel": me, "sent_at": time.time()}
        )
        say("-> %-24s %-28s" % (reply_to, "'got the room message'"))
        layer.group_discard(GROUP, me)
    except DemoFailure as exc:
        say("FAILED: %s" % exc)
        status = 3
    except Exception as exc:
        say("FAILED: %s: %s" % (type(exc).__name__, exc))
        status = 4
    finally:
        layer.close()
    sys.exit(status)


# -- process A ------------------------------------------------------------------------


def run_a(layer, url, prefix, management_url, me, b_channel, t0, say, hops):
    ctx = multiprocessing.get_context("spawn")
    ready = ctx.Event()
    b = ctx.Process(
        target=process_b, name="demo-B", args=(url, prefix, management_url, b_channel, t0, ready)
    )
    b.start()
    say("started process B (pid %d), my process-local channel is %s" % (b.pid, me))
    try:
        if not ready.wait(START_SECONDS):
            raise DemoFailure("process B was not ready within %.0f s" % START_SECONDS)
        say("B is ready (%.0f ms after start)" % ms(time.time() - t0))

        # (i) normal channel.
        sent_at = time.time()
        layer.send(
            PING_CHANNEL, {"type": "ping", "text": "ping", "reply_channel": me, "sent_at": sent_at}
        )
        say(
            "-> %-24s %-28s send confirmed in %.2f ms"
            % (PING_CHANNEL, "'ping'", ms(time.time() - sent_at))
        )

        # (ii) process-local channel: any demo.reply!* message lands in our queue.
        channel, pong, got_at = receive_until(
            layer, ["demo.reply!"], lambda c, m: m.get("type") == "pong", "the pong from B"
        )
        if channel != me:
            raise DemoFailure("the pong came on %s, not %s" % (channel, me))
        hop = ms(got_at - pong["sent_at"])
        say(
            "<- %-24s %-28s hop %6.2f ms, ping->pong round trip %.2f ms"
            % (channel, "'pong' from B", hop, ms(got_at - pong["ping_sent_at"]))
        )
        hops.append(("(i)   normal channel", "A -> B", PING_CHANNEL, pong["ping_hop_ms"]))
        hops.append(("(ii)  process-local channel", "B -> A", channel, hop))

        # (iii) group: B joined before it took the ping, so it is a member now.
        layer.group_add(GROUP, me)
        say("joined group %s as %s" % (GROUP, me))
        if management_url:
            try:
                say("group_channels(%r) = %s" % (GROUP, sorted(layer.group_channels(GROUP))))
            except Exception as exc:
                say("group_channels needs the management API: %s" % exc)
        sent_at = time.time()
        layer.send_group(GROUP, {"type": "room", "text": "hello room", "sent_at": sent_at})
        say(
            "=> group %-18s %-28s send_group confirmed in %.2f ms"
            % (GROUP, "'hello room'", ms(time.time() - sent_at))
        )

        seen = {}
        deadline = time.monotonic() + WAIT_SECONDS
        while len(seen) < 2:
            left = deadline - time.monotonic()
            channel, message, got_at = receive_until(
                layer,
                ["demo.reply!"],
                lambda c, m: m.get("type") in ("room", "room-ack"),
                "the room message and B's confirmation of it",
                timeout=max(left, 0.01),
            )
            seen[message["type"]] = (channel, message, got_at)
            if message["type"] == "room":
                hop = ms(got_at - message["sent_at"])
                say(
                    "<- %-24s %-28s hop %6.2f ms (group %s)"
                    % (channel, "'%s' (own copy)" % message["text"], hop, GROUP)
                )
                if channel != me:
                    raise DemoFailure("the group message came on %s, not %s" % (channel, me))
                hops.append(("(iii) group " + GROUP, "A -> A", channel, hop))
            else:
                say(
                    "<- %-24s %-28s B had it after %.2f ms"
                    % (channel, "'got the room message'", message["hop_ms"])
                )
                hops.append(("(iii) group " + GROUP, "A -> B", b_channel, message["hop_ms"]))
        layer.group_discard(GROUP, me)

        b.join(WAIT_SECONDS)
        if b.is_alive():
            raise DemoFailure("process B did not exit within %.0f s" % WAIT_SECONDS)
        if b.exitcode != 0:
            raise DemoFailure("process B exited with status %s" % b.exitcode)
        say("process B exited with status 0")
    finally:
        if b.is_alive():
            b.terminate()
            b.join(5)


def cleanup(layer, url, management_url, members):
    """Delete everything this run created (all under its prefix); one line saying so."""
    import pika
    import pika.exceptions

    topology = layer.topology
    flushed = ""
    if management_url:
        try:
            layer.flush()
            flushed = "flush() via the management API, then "
        except Exception as exc:
            flushed = "(flush failed: %s) " % exc
    layer.close()
    queues = [topology.channel_queue(c) for c in (PING_CHANNEL, "demo.reply!", "demo.b!")]
    queues += [topology.dead_letter_queue, topology.lease_queue]
    exchanges = [
        topology.group_exchange(GROUP),
        topology.dead_letter_exchange,
        topology.group_router,
    ]
    for channel in members:
        exchanges.append(topology.member_exchange(channel))
    connection = pika.BlockingConnection(pika.URLParameters(url))
    try:
        for kind, names in (("queue", queues), ("exchange", exchanges)):
            for name in names:
                channel = connection.channel()
                try:
                    getattr(channel, kind + "_delete")(name)
                    channel.close()
                except pika.exceptions.ChannelClosedByBroker:
                    pass  # already gone
    finally:
        connection.close()
    return "%sdeleted %d queues and %d exchanges under %s" % (
        flushed,
        len(queues),
        len(exchanges),
        topology.prefix,
    )


def main():
    url = os.environ.get("AMQP_URL") or DEFAULT_URL
    management_url = os.environ.get("AMQP_MANAGEMENT_URL") or None
    prefix = "demo-%s-%d" % (secrets.token_hex(3), os.getpid())
    t0 = time.time()
    say = Printer("A", t0)
    me = "demo.reply!" + secrets.token_hex(4)  # A's process-local channel
    b_channel = "demo.b!" + secrets.token_hex(4)  # B's, chosen here so A can clean up
    try:
        layer = make_layer(url, prefix, management_url)
        layer.receive([PING_CHANNEL])  # connects: fails within seconds without a broker
    except Exception as exc:
        print(
            "demo: cannot use the broker at %s: %s: %s" % (_redact(url), type(exc).__name__, exc),
            file=sys.stderr,
        )
        return 1
    print(
        "asgi_amqp demo: broker %s, prefix %s%s"
        % (_redact(url), prefix, "" if management_url else " (no management API given)")
    )
    hops, failure = [], None
    try:
        run_a(layer, url, prefix, management_url, me, b_channel, t0, say, hops)
    except DemoFailure as exc:
        failure = str(exc)
    except Exception as exc:
        failure = "%s: %s" % (type(exc).__name__, exc)
    finally:
        try:
            done = cleanup(layer, url, management_url, [me, b_channel])
        except Exception as exc:
            done = "clean-up failed: %s: %s" % (type(exc).__name__, exc)
    elapsed = time.time() - t0

    print("\nSummary")
    for what, direction, channel, hop in hops:
        print("  %-30s %-7s %-26s %7.2f ms" % (what, direction, channel, hop))
    print("  %s" % done)
    if failure:
        print("\ndemo FAILED after %.1f s: %s" % (elapsed, failure), file=sys.stderr)
        return 1
    print("  4 hops delivered, 2 processes, total %.1f s" % elapsed)
    return 0


def _redact(url):
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    if parts.password is None:
        return url
    return parts._replace(
        netloc="%s:***@%s" % (parts.username or "", parts.netloc.rpartition("@")[2])
    ).geturl()


if __name__ == "__main__":
    sys.exit(main())
