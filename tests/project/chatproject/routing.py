"""Channel routing (Channels 1.x): which consumer handles which message.

``http.request`` is not listed: runworker adds Django's view handler for it
(``Router.check_default``), so ``chatproject.urls`` serves plain HTTP.
"""

from channels.routing import route
from chat import consumers

ROOM_PATH = r"^/chat/(?P<room>[A-Za-z0-9_.-]{1,50})/$"
ECHO_PATH = r"^/echo/$"

channel_routing = [
    # A chat room: every member sees every message sent to the room.
    route("websocket.connect", consumers.chat_connect, path=ROOM_PATH),
    route("websocket.receive", consumers.chat_receive, path=ROOM_PATH),
    route("websocket.disconnect", consumers.chat_disconnect, path=ROOM_PATH),
    # Echo: each text frame comes back to its sender (tests and benchmarks).
    route("websocket.connect", consumers.echo_connect, path=ECHO_PATH),
    route("websocket.receive", consumers.echo_receive, path=ECHO_PATH),
]
