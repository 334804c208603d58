"""Hermes settings, read from the environment (docs/architecture.md §1, §7).

Embedded default: SQLite (WAL) in the project folder, the in-memory channel layer,
the in-process worker and the `demo` model. Scale-out: `DATABASE_URL` (PostgreSQL)
and `REDIS_URL` (channels_redis). Nothing here connects to anything.

Every environment variable Hermes reads is read here, through django-environ,
and listed in the README's configuration table. The one exception by design is
a provider's API key: `HERMES_PROVIDERS` names the variable that holds it, and
`chat.providers.registry` reads that variable when it builds the provider, so
the key never sits in settings. `HERMES_PROVIDERS` is checked by the `chat`
app's system check (`chat/checks.py`).
"""

import os
from pathlib import Path

import environ
from csp.constants import NONE, SELF
from django.core.exceptions import ImproperlyConfigured

from hermes_site.database_url import unix_socket_dir
from hermes_site.private_files import create_private, ensure_private, private_dir
from hermes_site.schema import WEBSOCKET_DESCRIPTION

env = environ.Env()

BASE_DIR = Path(__file__).resolve().parent.parent
# Local state: generated secret key, test databases.
VAR_DIR = private_dir(Path(env.str("HERMES_VAR_DIR", default="") or BASE_DIR / "var"))

SECRET_KEY = env.str("HERMES_SECRET_KEY", default="")
if not SECRET_KEY:
    # A per-install key kept beside the database, so sessions survive restarts
    # without anyone having to invent a secret on a fresh machine.
    _key_file = VAR_DIR / "secret_key"
    if not _key_file.exists():
        from django.core.management.utils import get_random_secret_key

        try:
            with create_private(_key_file) as _out:  # 0600 from the start
                _out.write(get_random_secret_key())
        except FileExistsError:
            pass  # another process made it first: use theirs
    SECRET_KEY = _key_file.read_text().strip()

DEBUG = env.bool("HERMES_DEBUG", default=False)
ALLOWED_HOSTS = env.list("HERMES_ALLOWED_HOSTS", default=["127.0.0.1", "localhost"])
CSRF_TRUSTED_ORIGINS = env.list("HERMES_CSRF_TRUSTED_ORIGINS", default=[])

# Behind TLS (docs/security.md): cookies only over HTTPS, HSTS, and the header
# a TLS-terminating proxy sets, e.g. HERMES_SECURE_PROXY_SSL_HEADER=
# "HTTP_X_FORWARDED_PROTO,https". All off by default for plain-HTTP loopback use.
_SECURE_COOKIES = env.bool("HERMES_SECURE_COOKIES", default=False)
SESSION_COOKIE_SECURE = _SECURE_COOKIES
CSRF_COOKIE_SECURE = _SECURE_COOKIES
SECURE_SSL_REDIRECT = env.bool("HERMES_SSL_REDIRECT", default=False)
# Probes and scrapers inside the network may speak plain HTTP.
SECURE_REDIRECT_EXEMPT = [r"^healthz$", r"^metrics$"]
SECURE_HSTS_SECONDS = env.int("HERMES_HSTS_SECONDS", default=0)
SECURE_HSTS_INCLUDE_SUBDOMAINS = env.bool(
    "HERMES_HSTS_INCLUDE_SUBDOMAINS", default=False
)
SECURE_HSTS_PRELOAD = env.bool("HERMES_HSTS_PRELOAD", default=False)
_PROXY_SSL_HEADER = env.list("HERMES_SECURE_PROXY_SSL_HEADER", default=[])
SECURE_PROXY_SSL_HEADER = (
    (_PROXY_SSL_HEADER[0], _PROXY_SSL_HEADER[1])
    if len(_PROXY_SSL_HEADER) == 2
    else None
)
SESSION_COOKIE_HTTPONLY = True

INSTALLED_APPS = [
    "daphne",
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "rest_framework.authtoken",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "channels",
    "axes",
    "csp",
    "journal",
    "chat",
]

MIDDLEWARE = [
    # A database outage answers 503 + Retry-After, never 500 (docs/operating.md).
    "hermes_site.outage_middleware.DatabaseOutageMiddleware",
    "django.middleware.security.SecurityMiddleware",
    # /static/ through WhiteNoise, before anything else reads the request.
    "hermes_site.static_files.StaticFilesMiddleware",
    "hermes_site.middleware.RejectNulMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    # Content-Security-Policy on every response (CONTENT_SECURITY_POLICY below).
    "csp.middleware.CSPMiddleware",
    # Last, as django-axes asks: answers 429 to a locked-out login.
    "axes.middleware.AxesMiddleware",
]

# Sent on every response by django-csp. Defence in depth behind the page's
# HTML sanitising: no inline script or style, no plugins, no remote images
# (model output must not exfiltrate a conversation through an <img> URL),
# requests only to this origin. No template needs a nonce.
CONTENT_SECURITY_POLICY = {
    "DIRECTIVES": {
        "default-src": [SELF],
        "script-src": [SELF],
        # The SharedWorker of static/hermes/js/shared-streams.js.
        "worker-src": [SELF],
        "style-src": [SELF],
        "img-src": [SELF, "data:", "blob:"],
        "connect-src": [SELF],
        "object-src": [NONE],
        "base-uri": [NONE],
        "form-action": [SELF],
        "frame-ancestors": [NONE],
    }
}

ROOT_URLCONF = "hermes_site.urls"
ASGI_APPLICATION = "hermes_site.asgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

# SQLite wants WAL and IMMEDIATE transactions under one writer and many readers,
# or "database is locked" appears under load (docs/architecture.md §1).
SQLITE_OPTIONS = {
    "transaction_mode": "IMMEDIATE",
    "timeout": 20,
    "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL",
}
DATABASES = {
    "default": env.db(
        "DATABASE_URL",
        default="sqlite:///"
        + env.str("HERMES_SQLITE_PATH", default=str(BASE_DIR / "db.sqlite3")),
    )
}
# PostgreSQL over a Unix socket as libpq writes it (%2F for each slash).
if (_socket_dir := unix_socket_dir(env.str("DATABASE_URL", default=""))) is not None:
    DATABASES["default"]["HOST"] = _socket_dir
# Test databases are per test process, so concurrent suites never share one.
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    DATABASES["default"]["OPTIONS"] = SQLITE_OPTIONS
    # The database holds every conversation: readable by its owner only.
    if (
        DATABASES["default"]["NAME"] not in ("", ":memory:")
        and Path(DATABASES["default"]["NAME"]).parent.is_dir()
    ):
        ensure_private(DATABASES["default"]["NAME"])
    # A file, not shared-cache memory: tests run a real server in other threads.
    DATABASES["default"]["TEST"] = {
        "NAME": str(VAR_DIR / f"test-db-{os.getpid()}.sqlite3")
    }
else:
    # A process paused inside a transaction (SIGSTOP, a VM freeze, a debugger)
    # would hold its runs' row locks for as long as it is paused, and every
    # process that settles or reaps those runs would wait on them. The server
    # ends such a session after this long, which frees the locks; our own
    # transactions are short and never wait on anything outside the database.
    _idle_ms = round(env.float("HERMES_DB_IDLE_TRANSACTION_S", default=10.0) * 1000)
    DATABASES["default"].setdefault("OPTIONS", {})["options"] = (
        f"-c idle_in_transaction_session_timeout={_idle_ms}"
    )
    DATABASES["default"]["TEST"] = {
        "NAME": f"test_{DATABASES['default']['NAME']}_{os.getpid()}"
    }
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

REDIS_URL = env.str("REDIS_URL", default="")
_CHANNEL_PREFIX = env.str("HERMES_CHANNEL_PREFIX", default="asgi")
if os.environ.get("PYTEST_XDIST_WORKER"):
    # Each process of a parallel test run keeps its own keys (tests count and
    # scan them); pytest-xdist names the process in the environment.
    _CHANNEL_PREFIX += f"-{os.environ['PYTEST_XDIST_WORKER']}"
if REDIS_URL:
    CHANNEL_LAYERS = {
        "default": {
            "BACKEND": "hermes_site.channel_layers.HermesRedisChannelLayer",
            "CONFIG": {
                "hosts": [REDIS_URL],
                # Every key starts with this: Hermes installs (or a benchmark)
                # sharing one Redis keep apart by it.
                "prefix": _CHANNEL_PREFIX,
                # Readers never rely on this: the journal decides.
                # See docs/architecture.md §5.6.
                "capacity": 1000,
                "group_expiry": 86400,
            },
        }
    }
else:
    CHANNEL_LAYERS = {
        "default": {
            "BACKEND": "hermes_site.channel_layers.HermesInMemoryChannelLayer",
            "CONFIG": {"capacity": 1000},
        }
    }

AUTH_PASSWORD_VALIDATORS = [
    {
        "NAME": "django.contrib.auth.password_validation."
        "UserAttributeSimilarityValidator"
    },
    {
        "NAME": "django.contrib.auth.password_validation.MinimumLengthValidator",
        "OPTIONS": {"min_length": env.int("HERMES_PASSWORD_MIN_LENGTH", default=8)},
    },
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]

# Login throttling (django-axes) on /accounts/login/ and /admin/login/: after
# HERMES_LOGIN_FAILURE_LIMIT wrong passwords for one username from one client
# address, that pair is refused (429) for HERMES_LOGIN_COOLOFF_MINUTES. Behind
# a proxy, HERMES_LOGIN_CLIENT_IP_HEADER names the header carrying the client's
# address (e.g. HTTP_X_REAL_IP); unset, the socket's peer address is used.
AUTHENTICATION_BACKENDS = [
    "axes.backends.AxesStandaloneBackend",
    "django.contrib.auth.backends.ModelBackend",
]
AXES_FAILURE_LIMIT = env.int("HERMES_LOGIN_FAILURE_LIMIT", default=5)
AXES_COOLOFF_TIME = env.float("HERMES_LOGIN_COOLOFF_MINUTES", default=15.0) / 60
AXES_LOCKOUT_PARAMETERS = [["username", "ip_address"]]
AXES_RESET_ON_SUCCESS = True
AXES_CLIENT_IP_CALLABLE = "hermes_site.login_guard.client_ip"
AXES_LOCKOUT_CALLABLE = "hermes_site.login_guard.locked_out"
# Axes's database handler, with each guess counted before its password is
# checked, so a parallel burst gets at most the limit (docs/security.md).
AXES_HANDLER = "hermes_site.login_guard.CountedGuessHandler"
HERMES_LOGIN_CLIENT_IP_HEADER = env.str("HERMES_LOGIN_CLIENT_IP_HEADER", default="")
LOGIN_URL = "/accounts/login/"
LOGIN_REDIRECT_URL = "/"
LOGOUT_REDIRECT_URL = "/accounts/login/"

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATICFILES_DIRS = [BASE_DIR / "static"] if (BASE_DIR / "static").exists() else []
STATIC_ROOT = VAR_DIR / "static"
# Static files (hermes_site/static_files.py): WhiteNoise serves what
# `collectstatic` put in STATIC_ROOT, with gzip and Brotli copies beside each
# file, and the finders' sources where nothing (or an older copy) was
# collected. The page's ES modules import each other by plain names (no
# build step adds content hashes), so browsers revalidate every file
# (max-age 0, ETag and Last-Modified: a 304 when unchanged) and never mix
# modules of two releases.
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "whitenoise.storage.CompressedStaticFilesStorage"},
}
WHITENOISE_USE_FINDERS = True
WHITENOISE_MAX_AGE = 0
WHITENOISE_ALLOW_ALL_ORIGINS = False  # the page's own origin loads them

REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "rest_framework.authentication.SessionAuthentication",
        "rest_framework.authentication.TokenAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    "DEFAULT_PARSER_CLASSES": [
        "chat.parsers.HermesJSONParser",
        "rest_framework.parsers.FormParser",
        "rest_framework.parsers.MultiPartParser",
    ],
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "EXCEPTION_HANDLER": "chat.api_errors.exception_handler",
    # Its rate comes from HERMES["USER_REQUEST_RATE"].
    "DEFAULT_THROTTLE_CLASSES": ["chat.limits.UserRequestThrottle"],
}
# Throttle counters live in this cache: per process unless HERMES_CACHE_URL
# names a shared one (e.g. redis://host:6379/1), which every web process of a
# scale-out deployment should then use.
CACHES = {"default": env.cache_url("HERMES_CACHE_URL", default="locmemcache://hermes")}
SPECTACULAR_SETTINGS = {
    "TITLE": "Hermes API",
    "DESCRIPTION": "Chat sessions, durable model runs and their event journals."
    + WEBSOCKET_DESCRIPTION,
    "VERSION": "1.0.0",
    # Like every endpoint: the schema and its browser need login.
    "SERVE_PERMISSIONS": ["rest_framework.permissions.IsAuthenticated"],
    # Swagger UI from the pinned sidecar package, served by this site: works
    # offline and under the pages' Content-Security-Policy (no CDN).
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    # Two fields are named `kind`: each choice set gets a name of its own.
    "ENUM_NAME_OVERRIDES": {
        "AttachmentKindEnum": "chat.models.Attachment.Kind",
        "PendingKindEnum": ["queue", "steer"],
    },
    "POSTPROCESSING_HOOKS": [
        "drf_spectacular.hooks.postprocess_schema_enums",
        "hermes_site.schema.add_stream_endpoints",
    ],
}

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    # Lines about a run end with run_id=… session_id=… (journal.logcontext;
    # chat.runner binds the session).
    "filters": {
        "run": {
            "()": "journal.logcontext.RunContextFilter",
            "fields": ["session_id"],
        }
    },
    "formatters": {
        "plain": {
            "()": "journal.logcontext.RunContextFormatter",
            "format": "%(asctime)s %(levelname)s %(name)s %(message)s",
        },
    },
    "handlers": {
        "console": {
            "class": "logging.StreamHandler",
            "formatter": "plain",
            "filters": ["run"],
        }
    },
    "root": {"handlers": ["console"], "level": env.str("HERMES_LOG_LEVEL", "INFO")},
    "loggers": {"httpx": {"level": "WARNING"}, "httpcore": {"level": "WARNING"}},
}

# --- Hermes -------------------------------------------------------------------
try:
    _PROVIDERS = env.json("HERMES_PROVIDERS", default=[])
except ValueError as exc:
    raise ImproperlyConfigured(f"HERMES_PROVIDERS is not valid JSON: {exc}") from exc
try:
    _MCP_SERVERS = env.json("HERMES_MCP_SERVERS", default=[])
except ValueError as exc:
    raise ImproperlyConfigured(f"HERMES_MCP_SERVERS is not valid JSON: {exc}") from exc
try:
    _MODEL_OUTPUT_TOKENS = env.json("HERMES_MODEL_OUTPUT_TOKENS", default={})
except ValueError as exc:
    raise ImproperlyConfigured(
        f"HERMES_MODEL_OUTPUT_TOKENS is not valid JSON: {exc}"
    ) from exc
if not isinstance(_MODEL_OUTPUT_TOKENS, dict) or not all(
    isinstance(v, int) and not isinstance(v, bool) and v > 0
    for v in _MODEL_OUTPUT_TOKENS.values()
):
    raise ImproperlyConfigured(
        "HERMES_MODEL_OUTPUT_TOKENS must be a JSON object of model names and "
        'positive whole numbers, e.g. {"smollm2-135m": 512}'
    )
try:
    _TOOL_APPROVAL = env.json("HERMES_TOOL_APPROVAL", default={})
except ValueError as exc:
    raise ImproperlyConfigured(
        f"HERMES_TOOL_APPROVAL is not valid JSON: {exc}"
    ) from exc

HERMES = {
    # A worker renews its leases this often; a lease it stops renewing lapses
    # after LEASE_S, and any reader or reaper may then settle the run.
    "LEASE_S": env.float("HERMES_LEASE_S", default=15.0),
    "HEARTBEAT_S": env.float("HERMES_HEARTBEAT_S", default=3.0),
    # A worker holds a run's output through a database outage this long, then
    # stops the model and settles the run as failed (category `database`) as
    # soon as the database answers (docs/operating.md).
    "DB_OUTAGE_MAX_S": env.float("HERMES_DB_OUTAGE_MAX_S", default=90.0),
    # A reader that hears nothing for this long checks the journal itself
    # (the channel layer is a doorbell, not a delivery guarantee).
    "READER_IDLE_CHECK_S": env.float("HERMES_READER_IDLE_CHECK_S", default=2.0),
    # Below common 30-60 s proxy idle limits.
    "SSE_KEEPALIVE_S": env.float("HERMES_SSE_KEEPALIVE_S", default=15.0),
    # Servers and workers run the garbage collector's full passes this often
    # (0: when the collector's own rule calls them; hermes_site/heap.py).
    "GC_FULL_EVERY_S": env.float("HERMES_GC_FULL_EVERY_S", default=60.0),
    # A stream reader whose unsent bytes stay above the per-reader bound this
    # long is closed and resumes from its cursor (hermes_site/backpressure.py).
    "SLOW_READER_S": env.float("HERMES_SLOW_READER_S", default=30.0),
    # EventSource reconnect delay announced in the `retry:` line.
    "SSE_RETRY_MS": env.int("HERMES_SSE_RETRY_MS", default=1000),
    # Open streams re-check their token or session this often and end when it
    # was revoked (rotated, logged out, user deactivated).
    "CREDENTIAL_CHECK_S": env.float("HERMES_CREDENTIAL_CHECK_S", default=5.0),
    "MAX_STREAM_RETRIES": env.int("MAX_STREAM_RETRIES", default=3),
    # After a chat's first answer, a short run asks its model for a title
    # (chat/titles.py); off: chats keep "New chat" until renamed.
    "TITLES": env.bool("HERMES_TITLES", default=True),
    "STREAM_IDLE_TIMEOUT_S": env.float("HERMES_STREAM_IDLE_TIMEOUT_S", default=300.0),
    # An answer's output limit in tokens, sent with every request (0: none,
    # the server's own, which for a local server may be its whole context);
    # a HERMES_PROVIDERS entry's `max_tokens` wins for its models. An answer
    # that reaches it ends `output-limit`, and the page offers Continue.
    "MAX_OUTPUT_TOKENS": env.int("HERMES_MAX_OUTPUT_TOKENS", default=4096),
    # Per model, over any provider's limit: {"model": tokens}.
    "MODEL_OUTPUT_TOKENS": _MODEL_OUTPUT_TOKENS,
    # Retries before response headers (429, 5xx, transport errors) and all
    # their waits together, Retry-After included; a HERMES_PROVIDERS entry's
    # `http_retries` / `retry_budget_s` win. Behind a proxy that retries
    # itself (LiteLLM), fewer keep a refusal quick.
    "HTTP_RETRIES": env.int("HERMES_HTTP_RETRIES", default=3),
    "RETRY_BUDGET_S": env.float("HERMES_RETRY_BUDGET_S", default=60.0),
    # How the `openai` endpoint is asked to continue a cut answer
    # (chat.checks.CONTINUATIONS; docs/providers.md).
    "CONTINUATION": env.str("HERMES_CONTINUATION", default="prefill"),
    "OPENAI_BASE_URL": env.str("OPENAI_BASE_URL", default=""),
    "OPENAI_API_KEY": env.str("OPENAI_API_KEY", default=""),
    "DEFAULT_MODEL": env.str("HERMES_DEFAULT_MODEL", default=""),
    # More model names of the `openai` provider, besides what it lists itself.
    "MODELS": [m.strip() for m in env.list("HERMES_MODELS", default=[]) if m.strip()],
    # More providers: a list of {"name", "base_url", "api_key_env", "models"}.
    "PROVIDERS": _PROVIDERS,
    "WORKER_CONCURRENCY": env.int("HERMES_WORKER_CONCURRENCY", default=32),
    # `manage.py worker` serves its Prometheus metrics on this port (unset: it
    # serves none; 0: any free port), on this address.
    "WORKER_METRICS_PORT": env.int("HERMES_WORKER_METRICS_PORT", default=None),
    "WORKER_METRICS_HOST": env.str("HERMES_WORKER_METRICS_HOST", default="127.0.0.1"),
    # Whether `serve` runs the turn worker inside the web process.
    "EMBEDDED_WORKER": env.bool("HERMES_EMBEDDED_WORKER", default=True),
    "MAX_MESSAGE_CHARS": env.int("HERMES_MAX_MESSAGE_CHARS", default=100_000),
    # Attachments (chat.attachments): the largest file, in bytes; files per
    # message; the extensions read as text or code (inlined into the prompt).
    # Images (PNG, JPEG, GIF, WebP, told by their bytes) go to models that take
    # them: HERMES_VISION_MODELS names those of the `openai` endpoint, a
    # HERMES_PROVIDERS entry says so with "vision" (docs/operating.md).
    "ATTACHMENT_MAX_BYTES": env.int(
        "HERMES_ATTACHMENT_MAX_BYTES", default=5 * 1024 * 1024
    ),
    "ATTACHMENT_MAX_FILES": env.int("HERMES_ATTACHMENT_MAX_FILES", default=5),
    "ATTACHMENT_TEXT_EXTENSIONS": [
        e.strip().lower().lstrip(".")
        for e in env.list("HERMES_ATTACHMENT_TEXT_EXTENSIONS", default=[])
        if e.strip()
    ],
    "VISION_MODELS": [
        m.strip() for m in env.list("HERMES_VISION_MODELS", default=[]) if m.strip()
    ],
    # An imported session file (POST /api/sessions/import/), in bytes.
    "IMPORT_MAX_BYTES": env.int("HERMES_IMPORT_MAX_BYTES", default=20 * 1024 * 1024),
    # Messages one imported session file may hold (413 `import_messages` past
    # it, before anything is written).
    "IMPORT_MAX_MESSAGES": env.int("HERMES_IMPORT_MAX_MESSAGES", default=20_000),
    # Messages one session may hold, every version of every branch counted: a
    # run of a session past it answers 429 `session_messages` (start a new
    # chat), an import of more 413.
    "SESSION_MAX_MESSAGES": env.int("HERMES_SESSION_MAX_MESSAGES", default=20_000),
    # File bytes one user may keep stored (uploads, imports; a file kept by
    # several messages counts once): 413 `HERMES_USER_MAX_STORED_BYTES` past it.
    "USER_MAX_STORED_BYTES": env.int(
        "HERMES_USER_MAX_STORED_BYTES", default=1024 * 1024 * 1024
    ),
    # A request body to any other route, in bytes (413 past it, before it is
    # read: hermes_site/request_limits.py); uploads and imports have theirs.
    "MAX_REQUEST_BYTES": env.int("HERMES_MAX_REQUEST_BYTES", default=2 * 1024 * 1024),
    # A request body that stops arriving for this long is answered 408.
    "REQUEST_BODY_TIMEOUT_S": env.float("HERMES_REQUEST_BODY_TIMEOUT_S", default=30.0),
    # /healthz: a worker heartbeat older than this is a worker gone (0: automatic).
    "HEALTH_WORKER_MAX_AGE_S": env.float("HERMES_HEALTH_WORKER_MAX_AGE_S", default=0.0),
    # Tools the model may call; unset means every safe built-in.
    "TOOLS": env.list("HERMES_TOOLS", default=None),
    # Anyone may sign up (else only the first user, or once an admin opens it).
    "OPEN_SIGNUP": env.bool("HERMES_OPEN_SIGNUP", default=False),
    # Sync tools run in child processes (chat.toolpool): this many, each with
    # this much address space, killed after the timeout.
    "TOOL_PROCESSES": env.int("HERMES_TOOL_PROCESSES", default=2),
    "TOOL_MEMORY_MB": env.int("HERMES_TOOL_MEMORY_MB", default=512),
    "TOOL_TIMEOUT_S": env.float("HERMES_TOOL_TIMEOUT_S", default=10.0),
    # Tool calls run per model step; calls past it answer the model an error.
    "MAX_TOOL_CALLS_PER_STEP": env.int("HERMES_MAX_TOOL_CALLS_PER_STEP", default=8),
    # A run's bounds (chat.budget): model steps, tool calls, reported tokens
    # (0: none) and wall time (0: none); a bound reached ends it `failed`.
    "RUN_MAX_STEPS": env.int("HERMES_RUN_MAX_STEPS", default=8),
    "RUN_MAX_TOOL_CALLS": env.int("HERMES_RUN_MAX_TOOL_CALLS", default=32),
    "RUN_MAX_TOKENS": env.int("HERMES_RUN_MAX_TOKENS", default=0),
    "RUN_MAX_SECONDS": env.float("HERMES_RUN_MAX_SECONDS", default=1800.0),
    # MCP tool servers (chat.mcp_tools): a list of {"name", "command" | "url", …}.
    "MCP_SERVERS": _MCP_SERVERS,
    # Approval policy per tool name, {"calculator": "ask", ...}: allow, ask or
    # deny (chat.approvals); a built-in not named is allowed, an MCP tool
    # follows its server's `tool_approval` or `approval`.
    "TOOL_APPROVAL": _TOOL_APPROVAL,
    # A run waiting for a person's approval this long ends `failed` /
    # `approval-timeout`; it holds no worker slot meanwhile.
    "APPROVAL_TIMEOUT_S": env.float("HERMES_APPROVAL_TIMEOUT_S", default=86400.0),
    # --- per-user limits (chat.limits; docs/security.md "Limits") -------------
    # Runs of one user the workers execute at once; the rest wait their turn
    # while other users' runs go first (fair claim, journal.leases).
    "USER_MAX_CONCURRENT_RUNS": env.int("HERMES_USER_MAX_CONCURRENT_RUNS", default=4),
    # Runs one user may start in any 60 s.
    "USER_RUNS_PER_MINUTE": env.int("HERMES_USER_RUNS_PER_MINUTE", default=20),
    # Open SSE + WebSocket streams of one user, per web process.
    "USER_MAX_STREAMS": env.int("HERMES_USER_MAX_STREAMS", default=32),
    # Sessions one user may own (archived ones included).
    "USER_MAX_SESSIONS": env.int("HERMES_USER_MAX_SESSIONS", default=1000),
    # API requests per signed-in user (a DRF throttle).
    "USER_REQUEST_RATE": env.str("HERMES_USER_REQUEST_RATE", default="240/min"),
}
