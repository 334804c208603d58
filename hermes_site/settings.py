"""Hermes settings, read from the environment (DESIGN §1, §7).

Embedded default: SQLite (WAL) in the project folder, the in-memory channel layer,
the in-process worker and the `demo` model. Scale-out: `DATABASE_URL` (PostgreSQL)
and `REDIS_URL` (channels_redis). Nothing here connects to anything.
"""

import os
from pathlib import Path

import environ

BASE_DIR = Path(__file__).resolve().parent.parent
VAR_DIR = BASE_DIR / "var"  # local state: generated secret key, test databases
VAR_DIR.mkdir(exist_ok=True)

env = environ.Env()

SECRET_KEY = env.str("HERMES_SECRET_KEY", default="")
if not SECRET_KEY:
    # A per-install key kept beside the database, so sessions survive restarts
    # without anyone having to invent a secret on a fresh machine.
    _key_file = VAR_DIR / "secret_key"
    if not _key_file.exists():
        from django.core.management.utils import get_random_secret_key

        _key_file.write_text(get_random_secret_key())
        _key_file.chmod(0o600)
    SECRET_KEY = _key_file.read_text().strip()

DEBUG = env.bool("HERMES_DEBUG", default=False)
ALLOWED_HOSTS = env.list("HERMES_ALLOWED_HOSTS", default=["127.0.0.1", "localhost"])
CSRF_TRUSTED_ORIGINS = env.list("HERMES_CSRF_TRUSTED_ORIGINS", default=[])

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
    "channels",
    "journal",
    "chat",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

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
# or "database is locked" appears under load (DESIGN §1).
SQLITE_OPTIONS = {
    "transaction_mode": "IMMEDIATE",
    "timeout": 20,
    "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL",
}
DATABASES = {
    "default": env.db(
        "DATABASE_URL",
        default=f"sqlite:///{env.str('HERMES_SQLITE_PATH', default=str(BASE_DIR / 'db.sqlite3'))}",
    )
}
# Test databases are per test process, so concurrent suites never share one.
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    DATABASES["default"]["OPTIONS"] = SQLITE_OPTIONS
    # A file, not shared-cache memory: tests run a real server in other threads.
    DATABASES["default"]["TEST"] = {
        "NAME": str(VAR_DIR / f"test-db-{os.getpid()}.sqlite3")
    }
else:
    DATABASES["default"]["TEST"] = {
        "NAME": f"test_{DATABASES['default']['NAME']}_{os.getpid()}"
    }
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

REDIS_URL = env.str("REDIS_URL", default="")
if REDIS_URL:
    CHANNEL_LAYERS = {
        "default": {
            "BACKEND": "channels_redis.core.RedisChannelLayer",
            "CONFIG": {
                "hosts": [REDIS_URL],
                # Readers never rely on this: the journal decides (DESIGN §5.6).
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
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
]
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

REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "rest_framework.authentication.SessionAuthentication",
        "rest_framework.authentication.TokenAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "EXCEPTION_HANDLER": "chat.api_errors.exception_handler",
}
SPECTACULAR_SETTINGS = {
    "TITLE": "Hermes API",
    "DESCRIPTION": "Chat sessions, durable model runs and their event journals.",
    "VERSION": "1.0.0",
}

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    # Lines about a run end with run_id=… session_id=… (journal.logcontext).
    "filters": {"run": {"()": "journal.logcontext.RunContextFilter"}},
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
HERMES = {
    # A worker renews its leases this often; a lease it stops renewing lapses
    # after LEASE_S, and any reader or reaper may then settle the run.
    "LEASE_S": env.float("HERMES_LEASE_S", default=15.0),
    "HEARTBEAT_S": env.float("HERMES_HEARTBEAT_S", default=3.0),
    # A reader that hears nothing for this long checks the journal itself
    # (the channel layer is a doorbell, not a delivery guarantee).
    "READER_IDLE_CHECK_S": env.float("HERMES_READER_IDLE_CHECK_S", default=2.0),
    # Below common 30-60 s proxy idle limits.
    "SSE_KEEPALIVE_S": env.float("HERMES_SSE_KEEPALIVE_S", default=15.0),
    # EventSource reconnect delay announced in the `retry:` line.
    "SSE_RETRY_MS": env.int("HERMES_SSE_RETRY_MS", default=1000),
    "MAX_STREAM_RETRIES": env.int("MAX_STREAM_RETRIES", default=3),
    "STREAM_IDLE_TIMEOUT_S": env.float("HERMES_STREAM_IDLE_TIMEOUT_S", default=300.0),
    "OPENAI_BASE_URL": env.str("OPENAI_BASE_URL", default=""),
    "OPENAI_API_KEY": env.str("OPENAI_API_KEY", default=""),
    "DEFAULT_MODEL": env.str("HERMES_DEFAULT_MODEL", default=""),
    "WORKER_CONCURRENCY": env.int("HERMES_WORKER_CONCURRENCY", default=32),
    # Whether `serve` runs the turn worker inside the web process.
    "EMBEDDED_WORKER": env.bool("HERMES_EMBEDDED_WORKER", default=True),
    "MAX_MESSAGE_CHARS": env.int("HERMES_MAX_MESSAGE_CHARS", default=100_000),
    # /healthz: a worker heartbeat older than this is a worker gone (0: automatic).
    "HEALTH_WORKER_MAX_AGE_S": env.float("HERMES_HEALTH_WORKER_MAX_AGE_S", default=0.0),
    # Tools the model may call; unset means every safe built-in.
    "TOOLS": env.list("HERMES_TOOLS", default=None),
}
