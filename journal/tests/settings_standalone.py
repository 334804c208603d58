"""The project's settings without `chat`: the journal's own tests run on these.

    pytest journal/tests --ds=journal.tests.settings_standalone

Proves the journal stands alone: its models, migrations, admin and readers
need nothing of chat (docs/architecture.md §2). Only the admin is routed.
"""

from hermes_site.settings import *  # noqa: F403

INSTALLED_APPS = [app for app in INSTALLED_APPS if app != "chat"]  # noqa: F405
ROOT_URLCONF = "journal.tests.urls_standalone"
# The project's API settings name chat's parser, throttle and error handler.
REST_FRAMEWORK = {}
