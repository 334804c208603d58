"""WebSocket origin check.

Browsers always send `Origin` on a WebSocket handshake, and a cross-site page
riding the user's cookie is the attack to stop (CSWSH), so a present Origin
must name one of ALLOWED_HOSTS. A handshake without Origin comes from a
non-browser client, which must then authenticate with a token of its own.
"""

from channels.security.websocket import OriginValidator
from django.conf import settings


class HermesOriginValidator(OriginValidator):
    def valid_origin(self, parsed_origin):
        if parsed_origin is None:
            return True
        return super().valid_origin(parsed_origin)


def origin_checked(application):
    return HermesOriginValidator(application, settings.ALLOWED_HOSTS)
