"""Full-text search over message text (docs/architecture.md §2, "Search").

SQLite: an FTS5 table over `chat_message.content` (external content, so the
text is stored once), kept in sync by triggers on every insert, update and
delete, and filled from the messages already there. PostgreSQL: a GIN index on
the `tsvector` of the content, which the search query's expression uses. Other
databases get nothing, and `chat.search` answers with no hits there.
"""

from django.db import migrations

from chat.search import (
    POSTGRES_INDEX,
    SQLITE_FTS_REBUILD,
    SQLITE_FTS_TABLE,
    SQLITE_FTS_TRIGGERS,
)

# The SQL lives with the search (one owner); `chat.search.fts_repair` uses it too.
SQLITE_UP = [*SQLITE_FTS_TABLE, *SQLITE_FTS_TRIGGERS, SQLITE_FTS_REBUILD]
SQLITE_DOWN = [
    "DROP TRIGGER IF EXISTS chat_message_fts_au",
    "DROP TRIGGER IF EXISTS chat_message_fts_ad",
    "DROP TRIGGER IF EXISTS chat_message_fts_ai",
    "DROP TABLE IF EXISTS chat_message_fts",
]
POSTGRES_DOWN = ["DROP INDEX IF EXISTS chat_message_content_tsv"]


def _run(statements: dict[str, list[str]]):
    def run(apps, schema_editor) -> None:
        for sql in statements.get(schema_editor.connection.vendor, []):
            schema_editor.execute(sql)

    return run


class Migration(migrations.Migration):
    dependencies = [("chat", "0003_turn")]

    operations = [
        migrations.RunPython(
            _run({"sqlite": SQLITE_UP, "postgresql": POSTGRES_INDEX}),
            _run({"sqlite": SQLITE_DOWN, "postgresql": POSTGRES_DOWN}),
        ),
    ]
