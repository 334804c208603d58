"""What `DATABASE_URL` names that django-environ does not read as libpq does."""

import re
from urllib.parse import unquote, urlsplit

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
