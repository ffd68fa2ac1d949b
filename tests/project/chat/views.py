"""Plain HTTP views, served through daphne and a runworker like any request."""

import os
import re

from django.http import JsonResponse
from django.shortcuts import render

_ROOM_RE = re.compile(r"^[A-Za-z0-9_.-]{1,50}$")


def index(request, room=None):
    """The chat page; the room comes from the URL, ``?room=`` or is ``lobby``."""
    room = room or request.GET.get("room") or "lobby"
    if not _ROOM_RE.match(room):
        room = "lobby"
    return render(request, "chat/index.html", {"room": room})


def hello(request):
    """A JSON answer naming the worker process that served it."""
    return JsonResponse(
        {"ok": True, "worker": os.getpid(), "path": request.path, "method": request.method}
    )


def ping(request):
    """A liveness probe that goes through daphne, the layer and a runworker."""
    return JsonResponse({"pong": True, "worker": os.getpid()})
