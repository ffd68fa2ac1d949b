"""Other Pythons for the test suite: Debian's, each in a root of its own.

setup.py claims Python 3.9 and later; CI's machine has one Python (Debian
12's 3.11). This module builds the oldest and newest claimed ones from
Debian's packages, the only place they come from on a machine that reaches
no more than the package registries:

=======  ===========================  =========
Python   Debian release               ``build``
=======  ===========================  =========
3.9      11, bullseye (3.9.2)         ``build 3.9``
3.13     13, trixie (3.13.5)          ``build 3.13``
=======  ===========================  =========

``build VERSION`` makes a minimal Debian root with ``debootstrap
--variant=minbase`` (about 260 MiB, under a minute), with that release's
``python3`` and ``python3-venv``; makes a virtualenv in it; and installs
this checkout there, editable, with the ``channels``, ``crypto`` and ``metrics`` extras
and the test runner's packages (``TEST_PACKAGES``: the ``test`` extra less
its lint tools, which ``make lint`` runs on the main Python). A root is
kept under ``$ASGI_AMQP_PYTHONS_DIR`` (default: ``asgi-amqp-pythons`` in the
system temp directory) and reused: a second ``build`` only reinstalls when
setup.py or the checkout's path changed.

``run VERSION -- CMD [ARGS...]`` runs CMD in that root, in this checkout's
directory, with the virtualenv first on ``PATH``. The root shares the
machine's network (a broker on 127.0.0.1 is reachable) and, through a
private mount namespace (``unshare --mount``), sees the checkout at its own
path and the machine's ``/proc`` and ``/dev``; those mounts end with CMD.
Only a few variables reach CMD: ``AMQP_URL``, ``AMQP_MANAGEMENT_URL``,
``ASGI_AMQP_*``, ``PYTEST_ADDOPTS``, ``TERM``, the proxy variables.

``path VERSION`` prints the root's directory and its interpreter.

It needs root (debootstrap, chroot, mounts) and Debian's archive
(``$ASGI_AMQP_DEBIAN_MIRROR``, default ``http://deb.debian.org/debian``);
as root it installs debootstrap with apt-get when it is missing. pip in
the root uses the machine's CA bundle, so that a proxy's authority that the
machine trusts is trusted there too.

Usage: ``python -m devtools.pythons build|path VERSION`` and
``python -m devtools.pythons run VERSION -- CMD [ARGS...]``.
"""

import argparse
import hashlib
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Dict, List, Mapping, Optional, Sequence

#: The Pythons this module builds: version -> the Debian release that ships it.
SUITES = {"3.9": "bullseye", "3.13": "trixie"}
DIR_VARIABLE = "ASGI_AMQP_PYTHONS_DIR"
MIRROR_VARIABLE = "ASGI_AMQP_DEBIAN_MIRROR"
MIRROR = "http://deb.debian.org/debian"
HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the checkout
VENV = "/opt/asgi-amqp-venv"  # inside the root
HOST_CA = "/etc/ssl/certs/ca-certificates.crt"
ROOT_CA = "/etc/ssl/certs/asgi-amqp-host-ca.crt"  # inside the root
EXTRAS = "channels,crypto,metrics"
#: The test extra less the lint tools (ruff, mypy, stubs, import-linter),
#: which make lint runs on the main Python only.
TEST_PACKAGES = ["pytest>=7", "hypothesis>=6", "docker>=6", "websocket-client>=1.0"]
PASSED_VARIABLES = ("AMQP_URL", "AMQP_MANAGEMENT_URL", "PYTEST_ADDOPTS", "TERM")
PROXY_VARIABLES = ("http_proxy", "https_proxy", "no_proxy", "HTTP_PROXY", "HTTPS_PROXY")
#: Paths of the machine's that the root's variables must not point into.
HOST_ONLY_VARIABLES = ("ASGI_AMQP_RABBITMQ_SERVER_DIR", "ASGI_AMQP_ERLANG_ROOT", DIR_VARIABLE)
ROOT_STAMP = ".asgi-amqp-root"
VENV_STAMP = ".asgi-amqp-installed"


class PythonUnavailable(RuntimeError):
    """This machine cannot build or run that Python (the message says why)."""


def _say(message: str) -> None:
    sys.stderr.write("pythons: %s\n" % message)
    sys.stderr.flush()


def suite(version: str) -> str:
    try:
        return SUITES[version]
    except KeyError:
        raise PythonUnavailable(
            "no Python %s here: the versions are %s" % (version, ", ".join(SUITES))
        )


def base_dir() -> str:
    return os.environ.get(DIR_VARIABLE) or os.path.join(tempfile.gettempdir(), "asgi-amqp-pythons")


def root_dir(version: str) -> str:
    return os.path.join(base_dir(), suite(version))


def _check_machine() -> None:
    if os.geteuid() != 0:
        raise PythonUnavailable("building a Debian root needs root (debootstrap, chroot)")
    for tool in ("chroot", "unshare", "mount"):
        if shutil.which(tool) is None:
            raise PythonUnavailable("%s is not installed" % tool)
    if shutil.which("debootstrap") is None:
        if shutil.which("apt-get") is None:
            raise PythonUnavailable("debootstrap is not installed and there is no apt-get")
        _say("installing debootstrap")
        install = ["apt-get", "install", "-y", "-q", "debootstrap"]
        env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
        if subprocess.run(install, env=env, stdout=subprocess.DEVNULL).returncode != 0:
            subprocess.run(["apt-get", "update", "-q"], env=env, stdout=subprocess.DEVNULL)
            if subprocess.run(install, env=env, stdout=subprocess.DEVNULL).returncode != 0:
                raise PythonUnavailable("apt-get could not install debootstrap")


def _check(command: Sequence[str], what: str, timeout: float) -> None:
    try:
        done = subprocess.run(
            list(command),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            timeout=timeout,
        )
    except subprocess.TimeoutExpired:
        raise PythonUnavailable("%s took more than %d s" % (what, timeout))
    if done.returncode != 0:
        tail = "\n".join(done.stdout.strip().splitlines()[-15:])
        raise PythonUnavailable("%s failed (exit status %d):\n%s" % (what, done.returncode, tail))


def _debootstrap(version: str, root: str) -> None:
    if os.path.exists(root):
        shutil.rmtree(root)  # a build that did not finish
    os.makedirs(os.path.dirname(root), exist_ok=True)
    mirror = os.environ.get(MIRROR_VARIABLE) or MIRROR
    _say("debootstrap %s (Python %s) into %s" % (suite(version), version, root))
    _check(
        [
            "debootstrap",
            "--variant=minbase",
            "--include=python3,python3-venv,ca-certificates",
            suite(version),
            root,
            mirror,
        ],
        "debootstrap %s" % suite(version),
        timeout=900,
    )
    with open(os.path.join(root, ROOT_STAMP), "w") as handle:
        handle.write("%s %s\n" % (suite(version), mirror))


def _refresh_host_files(root: str) -> None:
    """The machine's name resolution and CA bundle, copied in on every build."""
    if os.path.exists("/etc/resolv.conf"):
        shutil.copyfile("/etc/resolv.conf", os.path.join(root, "etc/resolv.conf"))
    with open(os.path.join(root, "etc/hosts"), "w") as handle:
        handle.write("127.0.0.1 localhost\n::1 localhost ip6-localhost ip6-loopback\n")
    if os.path.exists(HOST_CA):
        shutil.copyfile(HOST_CA, root + ROOT_CA)


def _install_key() -> str:
    with open(os.path.join(HERE, "setup.py"), "rb") as handle:
        setup = hashlib.sha256(handle.read()).hexdigest()
    return json.dumps([HERE, setup, EXTRAS, TEST_PACKAGES])


def build(version: str) -> str:
    """Build (or reuse) the root of ``version``; returns its interpreter's path in it."""
    _check_machine()
    root = root_dir(version)
    started = time.monotonic()
    if not os.path.exists(os.path.join(root, ROOT_STAMP)):
        _debootstrap(version, root)
    _refresh_host_files(root)
    stamp = root + VENV + "/" + VENV_STAMP
    key = _install_key()
    try:
        with open(stamp) as handle:
            if handle.read() == key:
                return VENV + "/bin/python"
    except OSError:
        pass
    _say("installing the checkout in %s's virtualenv" % suite(version))
    python = VENV + "/bin/python"
    pip = [python, "-m", "pip", "install", "-q", "--progress-bar", "off"]
    if os.path.exists(root + VENV):
        shutil.rmtree(root + VENV)  # 3.9's venv --clear trips on its own symlinks
    steps = [
        (["python3", "-m", "venv", VENV], "python3 -m venv"),
        (pip + ["--upgrade", "pip"], "pip install --upgrade pip"),
        (pip + ["-e", "%s[%s]" % (HERE, EXTRAS)] + TEST_PACKAGES, "pip install the checkout"),
    ]
    for command, what in steps:
        _check(_in_root(version, command, {}), "%s in %s" % (what, suite(version)), 900)
    with open(stamp, "w") as handle:
        handle.write(key)
    _say("Python %s ready in %.0f s" % (version, time.monotonic() - started))
    return python


def _root_environ(extra: Mapping[str, str]) -> Dict[str, str]:
    env = {
        "PATH": VENV + "/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        "HOME": "/root",
        "LANG": "C.UTF-8",
        "PIP_DISABLE_PIP_VERSION_CHECK": "1",
    }
    for name, value in os.environ.items():
        if name in PASSED_VARIABLES or name in PROXY_VARIABLES or name.startswith("PIP_"):
            env[name] = value
        elif name.startswith("ASGI_AMQP_") and name not in HOST_ONLY_VARIABLES:
            env[name] = value
    for name in ("PIP_FIND_LINKS", "PIP_CONFIG_FILE", "PIP_CERT"):
        env.pop(name, None)  # the machine's paths, not the root's
    env["PIP_CERT"] = ROOT_CA
    env.update(extra)
    return env


def _in_root(version: str, command: Sequence[str], env: Mapping[str, str]) -> List[str]:
    """The command line that runs ``command`` in the root, in the checkout's directory."""
    root = root_dir(version)
    inner = "cd %s && exec %s" % (
        shlex.quote(HERE),
        " ".join(shlex.quote(part) for part in ["env", "-i"] + _env_args(env) + list(command)),
    )
    mounts = " && ".join(
        [
            "mount -t proc proc %s" % shlex.quote(root + "/proc"),
            "mount --rbind /dev %s" % shlex.quote(root + "/dev"),
            "mkdir -p %s" % shlex.quote(root + HERE),
            "mount --bind %s %s" % (shlex.quote(HERE), shlex.quote(root + HERE)),
            "exec chroot %s /bin/sh -c %s" % (shlex.quote(root), shlex.quote(inner)),
        ]
    )
    return ["unshare", "--mount", "--propagation", "private", "/bin/sh", "-c", mounts]


def _env_args(env: Mapping[str, str]) -> List[str]:
    return ["%s=%s" % item for item in sorted(_root_environ(env).items())]


def command(
    version: str, argv: Sequence[str], env: Optional[Mapping[str, str]] = None
) -> List[str]:
    """The command line that runs ``argv`` with Python ``version`` (built first if need be)."""
    build(version)
    return _in_root(version, argv, env or {})


def interpreter_version(version: str) -> str:
    """The full version of the root's Python (e.g. "3.9.2")."""
    done = subprocess.run(
        command(version, ["python", "-c", "import platform; print(platform.python_version())"]),
        stdout=subprocess.PIPE,
        text=True,
        timeout=120,
    )
    return done.stdout.strip() or version


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m devtools.pythons", description=__doc__)
    sub = parser.add_subparsers(dest="action", required=True)
    for name, helptext in (
        ("build", "build (or reuse) that Python's root and virtualenv"),
        ("path", "print the root's directory and its interpreter (built first)"),
        ("run", "run CMD with that Python, in the checkout's directory"),
    ):
        p = sub.add_parser(name, help=helptext)
        p.add_argument("version", choices=sorted(SUITES))
        if name == "run":
            p.add_argument("cmd", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    try:
        if args.action == "run":
            cmd = list(args.cmd)
            if cmd[:1] == ["--"]:
                cmd = cmd[1:]
            if not cmd:
                parser.error("run: no command given (usage: run VERSION -- CMD [ARGS...])")
            return subprocess.call(command(args.version, cmd))
        python = build(args.version)
        if args.action == "path":
            print("root %s" % root_dir(args.version))
            print("python %s (inside the root)" % python)
    except PythonUnavailable as exc:
        _say("Python %s: %s" % (args.version, exc))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
