"""`DATABASE_URL` in libpq's form for a Unix socket: read where django-environ
does not read it as libpq does, and written so that it reads back."""

import re
from urllib.parse import quote, unquote, urlsplit

from environ import Env


def unix_socket_dir(url: str) -> str | None:
    """The directory of the Unix socket a PostgreSQL URL names in libpq's own
    form, `postgres://user@%2Frun%2Fpostgresql:5432/hermes`, else None.

    django-environ keeps such a host percent-encoded (and lower-cased), and
    the driver then looked up `%2frun%2fpostgresql` as a host name. The port,
    when given, stays where it is: it names the socket's file in the directory.
    """
    parts = urlsplit(url)
    if parts.scheme not in Env.POSTGRES_FAMILY:  # django-environ's own list
        return None
    host = parts.netloc.rpartition("@")[2]
    if not host.upper().startswith("%2F"):
        return None
    return unquote(re.sub(r":\d*$", "", host))


def postgres_url(user: str, host: str, port: int | str, name: str) -> str:
    """A PostgreSQL URL that `unix_socket_dir` and the settings read back: a
    socket's directory as host is written as libpq writes it (%2F for /)."""
    if host.startswith("/"):
        host = quote(host, safe="")
    return f"postgres://{user}@{host}:{port}/{name}"
