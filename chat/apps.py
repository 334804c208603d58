from django.apps import AppConfig
from django.db.models.signals import post_migrate


class ChatConfig(AppConfig):
    name = "chat"
    verbose_name = "Chat"

    def ready(self) -> None:
        from . import (  # noqa: F401  (receivers)
            checks,
            metrics,
            pending,
            search,
            services,
        )

        metrics.register()  # this process's model requests, in /metrics
        # A migration that remakes chat_message on SQLite drops the search's
        # triggers with it; they come back after every migrate.
        post_migrate.connect(search.fts_repair, sender=self)
