"""WebSocket origin check: the full origin (scheme, host, port) must be allowed.

Browsers always send `Origin` on a WebSocket handshake, and a cross-site page
riding the user's cookie is the attack to stop (CSWSH). Comparing host names
alone is not enough: a page on `http://127.0.0.1:9999` is another origin than
Hermes on `http://127.0.0.1:8000`, and browsers give it the same cookies. So
a present Origin must equal, scheme and port included, either

- the handshake's own origin: `Host` (one of ALLOWED_HOSTS) under `http`, or
  `https` when the socket is `wss` or, behind a proxy, when
  SECURE_PROXY_SSL_HEADER says so; or
- one of CSRF_TRUSTED_ORIGINS (`HERMES_CSRF_TRUSTED_ORIGINS`), where
  `https://*.example.com` admits subdomains as Django's CSRF check does.

A handshake without Origin comes from a non-browser client, which must then
authenticate with a token of its own (cookies are a browser's).
"""

from urllib.parse import urlsplit

from channels.security.websocket import WebsocketDenier
from django.conf import settings
from django.http.request import split_domain_port, validate_host

DEFAULT_PORTS = {"http": 80, "https": 443}


def _normalise(origin: str) -> tuple[str, str, int] | None:
    """`scheme://host[:port]` -> (scheme, host, port), or None if malformed."""
    try:
        parts = urlsplit(origin.strip())
        port = parts.port
    except ValueError:
        return None
    scheme = parts.scheme.lower()
    if scheme not in DEFAULT_PORTS or not parts.hostname:
        return None
    if parts.path not in ("", "/") or parts.query or parts.username:
        return None
    return scheme, parts.hostname.lower(), port or DEFAULT_PORTS[scheme]


def _headers(scope) -> dict[bytes, bytes]:
    return {name.lower(): value for name, value in scope.get("headers", ())}


def _secure(scope, headers: dict[bytes, bytes]) -> bool:
    if scope.get("scheme") == "wss":
        return True
    proxy = settings.SECURE_PROXY_SSL_HEADER
    if proxy:
        name, expected = proxy
        # Django's name is the WSGI form: HTTP_X_FORWARDED_PROTO.
        header = name.removeprefix("HTTP_").replace("_", "-").lower().encode()
        value = headers.get(header, b"").decode("latin-1").split(",")[0].strip()
        return value == expected
    return False


def own_origin(scope) -> tuple[str, str, int] | None:
    """The origin a page served by this site, at the handshake's Host, has."""
    headers = _headers(scope)
    host = headers.get(b"host", b"").decode("latin-1")
    domain, _port = split_domain_port(host)
    if not domain or not validate_host(domain, settings.ALLOWED_HOSTS):
        return None
    scheme = "https" if _secure(scope, headers) else "http"
    return _normalise(f"{scheme}://{host}")


def _trusted(origin: tuple[str, str, int]) -> bool:
    scheme, host, port = origin
    for entry in settings.CSRF_TRUSTED_ORIGINS:
        wildcard = "://*." in entry
        trusted = _normalise(entry.replace("://*.", "://", 1))
        if trusted is None or trusted[0] != scheme or trusted[2] != port:
            continue
        if host == trusted[1] or (wildcard and host.endswith("." + trusted[1])):
            return True
    return False


def origin_allowed(scope) -> bool:
    raw = _headers(scope).get(b"origin")
    if raw is None:
        return True
    origin = _normalise(raw.decode("latin-1"))
    if origin is None:
        return False
    return origin == own_origin(scope) or _trusted(origin)


def origin_checked(application):
    """Wrap a WebSocket application: a foreign Origin is refused (HTTP 403)."""

    from .consumers import outage_guarded  # the stack's database outages: 1013

    application = outage_guarded(application)

    async def checked(scope, receive, send):
        if origin_allowed(scope):
            return await application(scope, receive, send)
        return await WebsocketDenier()(scope, receive, send)

    return checked
