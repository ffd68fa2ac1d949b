"""ASGI channel and group names: which are valid, and what a name says.

The ASGI spec's rules, checked in the caller's thread before anything reaches
the broker. ``naming`` relies on their one guarantee: ``:`` is not in the
alphabet, so a broker name built from a channel or group parses back.
"""

import re

# Not asgiref's regexes: their "$" admits a trailing newline, which the broker drops from
# a name, and their Unicode \d, \w a name past AMQP's 255 bytes
# (tests/test_bad_input.py::test_names_the_broker_cannot_take_are_refused).
CHANNEL_NAME_RE = re.compile(r"[a-zA-Z0-9\-_.]+([?!][a-zA-Z0-9\-_.]*)?", re.ASCII)
GROUP_NAME_RE = re.compile(r"[a-zA-Z0-9\-_.]+", re.ASCII)
MAX_NAME_LENGTH = 99  # asgiref: names shorter than 100 characters


def check_channel_name(name: object, receive: bool = False) -> None:
    """Raise TypeError unless ``name`` is a valid ASGI channel name."""
    if not (
        isinstance(name, str) and len(name) <= MAX_NAME_LENGTH and CHANNEL_NAME_RE.fullmatch(name)
    ):
        raise TypeError(
            "channel name must be a str of fewer than 100 ASCII letters, digits, '-', '_' "
            "or '.', with at most one '?' or '!' part; got %r" % (name,)
        )
    if "?" in name and name.endswith("?"):
        raise TypeError("single-reader channel names must not end with '?': %r" % name)
    if receive and "!" in name and not name.endswith("!"):
        raise TypeError("process-local channel names in receive() must end at the '!': %r" % name)


def check_group_name(name: object) -> None:
    """Raise TypeError unless ``name`` is a valid ASGI group name."""
    if not (
        isinstance(name, str) and len(name) <= MAX_NAME_LENGTH and GROUP_NAME_RE.fullmatch(name)
    ):
        raise TypeError(
            "group name must be a str of fewer than 100 ASCII letters, digits, '-', '_' "
            "or '.'; got %r" % (name,)
        )


def non_local_name(channel: str) -> str:
    """``foo!bar`` -> ``foo!``; other names are returned unchanged."""
    index = channel.find("!")
    if index == -1:
        return channel
    return channel[: index + 1]


def is_process_local(channel: str) -> bool:
    return "!" in channel
