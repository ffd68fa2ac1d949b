"""A contestant in a process of its own, driven by the harness over a pipe.

    <python> -m benchmarks.worker      (cwd: the repository root)

Used for asgi_redis 1.4.3, which needs the old ``msgpack-python`` and so
lives in a virtualenv of its own, and for the layer imported from a source
tree (``$BENCH_LAYER_SRC``, see ``common.apply_layer_source``:
``layer@baseline`` and ``layer@current``). The worker plays whole rounds with
the same runners and trials as the harness's process (``harness``,
``asgi_trials``) and sends back the samples; nothing is timed across the
pipe.

Protocol: one JSON object per line. Requests on stdin::

    {"cmd": "setup", "layer": "redis"|"amqp", "config": {...}}
    {"cmd": "round", "scenario": "send", "ops": 3000}
    {"cmd": "teardown"}

Each request gets one reply ``{"ok": true, ...}`` or ``{"ok": false,
"error": "..."}``. Anything the libraries print goes to stderr.
"""

import json
import os
import sys
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from benchmarks import asgi_trials, common  # noqa: E402
from benchmarks.harness import SCENARIOS, RoundResult  # noqa: E402
from benchmarks.scenarios import MESSAGE_SIZE  # noqa: E402,F401  (registers scenarios)

# -- layers --------------------------------------------------------------------------


class RedisKeeper(asgi_trials.Keeper):
    """Housekeeping straight on asgi_redis's keys: a channel is the list
    ``prefix + channel`` of message keys."""

    def _conn(self):
        return self.layer.connection(0)

    def _key(self, channel):
        return self.layer.prefix + channel

    def purge(self, channel):
        self._conn().delete(self._key(channel))

    def depth(self, channel):
        return self._conn().llen(self._key(channel))


def make_redis(config):
    import msgpack
    from asgi_redis import RedisChannelLayer

    class Layer(RedisChannelLayer):
        # asgi_redis 1.4.3 calls unpackb(encoding="utf8"), which msgpack 1.x
        # rejects; with msgpack 1.x installed over msgpack-python (C speed,
        # like the other contestants) decode the same way with raw=False.
        if msgpack.version >= (1,):

            def deserialize(self, message):
                return msgpack.unpackb(message, raw=False)

    layer = Layer(
        hosts=[config["redis_url"]],
        prefix=config["prefix"],
        capacity=config.get("capacity", asgi_trials.CAPACITY),
        expiry=config.get("expiry", asgi_trials.EXPIRY),
    )
    info = layer.connection(0).info("server")
    versions = common.package_versions(
        ["asgi_redis", "redis", "msgpack", "msgpack-python", "asgiref"]
    )
    versions["msgpack (imported)"] = ".".join(str(x) for x in msgpack.version)
    versions["redis-server"] = info.get("redis_version")
    return layer, RedisKeeper(layer), versions


def make_amqp(config):
    # Only the public API: the layer's internal modules differ between versions.
    import asgi_amqp
    from asgi_amqp import AMQPChannelLayer
    from benchmarks.broker import Admin, LayerKeeper, layer_objects

    source = common.check_layer_source()
    layer = AMQPChannelLayer(
        url=config["url"],
        prefix=config["prefix"],
        capacity=config.get("capacity", asgi_trials.CAPACITY),
        expiry=config.get("expiry", asgi_trials.EXPIRY),
        management_url=config.get("management_url"),
    )
    versions = common.package_versions(["pika", "msgpack", "asgiref"])
    versions["asgi_amqp"] = asgi_amqp.__version__
    versions["source"] = os.path.dirname(source)
    queues, exchanges = layer_objects(layer.topology, asgi_trials.ALL_CHANNELS, asgi_trials.GROUP)
    # The harness deletes these at the end (flush() keeps the shared ones).
    versions["_cleanup"] = {"queues": queues, "exchanges": exchanges}
    keeper = LayerKeeper(layer, Admin(config["url"], config.get("management_url")))
    return layer, keeper, versions


FACTORIES = {"redis": make_redis, "amqp": make_amqp}


# -- the loop --------------------------------------------------------------------------


class Worker(object):
    def __init__(self, out):
        self.out = out
        self.layer = None
        self.trials = None

    def send(self, obj):
        self.out.write(json.dumps(obj, separators=(",", ":")) + "\n")
        self.out.flush()

    def handle(self, request):
        cmd = request.get("cmd")
        if cmd == "setup":
            layer, keeper, versions = FACTORIES[request["layer"]](request["config"])
            self.layer = layer
            self.trials = asgi_trials.LayerTrials(layer, keeper)
            scenarios = [name for name in SCENARIOS if self.trials.has(name)]
            cleanup = versions.pop("_cleanup", None)
            return {
                "versions": versions,
                "scenarios": scenarios,
                "cleanup": cleanup,
                "python": sys.version.split()[0],
            }
        if cmd == "round":
            scenario = SCENARIOS[request["scenario"]]
            trial = self.trials.trial(scenario.name, request["ops"])
            try:
                trial.prepare()
                result = scenario.runner(trial, request["ops"])
                result.problems = list(trial.finish() or [])
                result.delivered = trial.delivered
            except Exception as exc:
                result = RoundResult.failed("%s: %s" % (type(exc).__name__, exc))
            return {"result": result.to_dict()}
        if cmd == "teardown":
            layer, self.layer = self.layer, None
            if layer is not None:
                flush = getattr(layer, "flush", None)
                if flush is not None:
                    try:
                        flush()
                    except Exception as exc:
                        sys.stderr.write("worker: flush failed: %s\n" % exc)
                close = getattr(layer, "close", None)
                if close is not None:
                    close()
            close_keeper = getattr(self.trials.keeper, "close", None) if self.trials else None
            if close_keeper is not None:
                close_keeper()
            return {}
        raise ValueError("unknown command %r" % (cmd,))


def main():
    common.apply_layer_source()
    # The protocol owns the real stdout; whatever else prints goes to stderr.
    out = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    worker = Worker(out)
    for line in sys.stdin:
        line = line.strip()
        if not line:
            continue
        try:
            reply = worker.handle(json.loads(line))
            reply["ok"] = True
        except Exception as exc:
            traceback.print_exc()
            reply = {"ok": False, "error": "%s: %s" % (type(exc).__name__, exc)}
        worker.send(reply)
        if json.loads(line).get("cmd") == "teardown":
            break
    return 0


if __name__ == "__main__":
    sys.exit(main())
