"""The system packages the make targets need, installed with apt-get when missing.

``python -m devtools.install broker browser`` (``make test``'s prerequisites),
``python -m devtools.install --optional redis java`` (``make bench``'s). A
missing package is installed only when we are root; otherwise the command
says what to install. A required one still missing is exit status 1; an
optional one only a line on stderr (the benchmarks leave its contestant out).

``broker`` is Debian's rabbitmq-server, for private nodes: not needed when
``AMQP_URL`` is set or a Docker engine answers (``devtools.rabbitmq``). Its
post-install start may be denied by policy (policy-rc.d); the tests start
their own nodes, so only the binary is checked.
"""

import argparse
import os
import shutil
import socket
import subprocess
import sys
from typing import Callable, Dict, List, Optional, Tuple

SBIN = ("/usr/sbin", "/usr/lib/rabbitmq/bin", "/usr/bin")


def _which(name: str) -> Optional[str]:
    found = shutil.which(name)
    if found:
        return found
    for folder in SBIN:
        path = os.path.join(folder, name)
        if os.access(path, os.X_OK):
            return path
    return None


def _redis_answers(host: str = "127.0.0.1", port: int = 6379) -> bool:
    try:
        with socket.create_connection((host, port), 1) as sock:
            sock.sendall(b"PING\r\n")
            return sock.recv(16).startswith(b"+PONG")
    except OSError:
        return False


def _docker_answers() -> bool:
    try:
        from devtools.rabbitmq import _docker_client
    except ImportError:  # the docker package is not installed yet
        return False
    return _docker_client() is not None


def _broker() -> Optional[str]:
    if os.environ.get("AMQP_URL"):
        return "AMQP_URL is set, no local broker needed"
    if _which("rabbitmq-server"):
        return "rabbitmq-server is installed"
    if _docker_answers():
        return "a Docker engine answers, brokers will run in containers"
    return None


def _browser() -> Optional[str]:
    if _which("chromium") and _which("chromedriver"):
        return "chromium and chromedriver are installed"
    return None


def _redis() -> Optional[str]:
    if os.environ.get("BENCH_REDIS_URL") or os.environ.get("REDIS_URL"):
        return "a Redis URL is set"
    if _redis_answers():
        return "a Redis answers on 127.0.0.1:6379"
    if _which("redis-server"):
        return "redis-server is installed (a private one is started when needed)"
    return None


def _java() -> Optional[str]:
    return "java is installed" if _which("java") else None


# name -> (how to tell it is there, Debian packages, what happens without it)
NEEDS: Dict[str, Tuple[Callable[[], Optional[str]], List[str], str]] = {
    "broker": (_broker, ["rabbitmq-server"], "or set AMQP_URL=amqp://..."),
    "browser": (_browser, ["chromium", "chromium-driver"], "the browser test needs them"),
    "redis": (_redis, ["redis-server"], "asgi_redis is left out of the benchmarks"),
    "java": (_java, ["default-jre-headless"], "PySpark parts of the benchmarks are left out"),
}


def ensure(names: List[str], log: Callable[[str], None]) -> List[str]:
    """Install what is missing of ``names``; return the names still missing."""
    missing = []
    for name in names:
        present = NEEDS[name][0]()
        if present:
            log("%s: %s" % (name, present))
        else:
            missing.append(name)
    if not missing:
        return []
    packages = [package for name in missing for package in NEEDS[name][1]]
    if os.geteuid() != 0:
        for name in missing:
            log(
                "%s: missing (as root: apt-get install %s); %s"
                % (name, " ".join(NEEDS[name][1]), NEEDS[name][2])
            )
        return missing
    log("installing %s" % " ".join(packages))
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    if not (
        subprocess.call(["apt-get", "update"], env=env) == 0
        and subprocess.call(["apt-get", "install", "-y"] + packages, env=env) == 0
    ):
        log("apt-get reported a failure (a denied post-install start is expected); checking")
    still = [name for name in missing if not NEEDS[name][0]()]
    for name in still:
        log("%s: still missing; %s" % (name, NEEDS[name][2]))
    return still


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m devtools.install", description=__doc__)
    parser.add_argument("names", nargs="+", choices=sorted(NEEDS))
    parser.add_argument(
        "--optional", action="store_true", help="never fail: what stays missing is only reported"
    )
    args = parser.parse_args(argv)
    still = ensure(args.names, lambda text: print("install: " + text, file=sys.stderr))
    return 0 if args.optional or not still else 1


if __name__ == "__main__":
    sys.exit(main())
