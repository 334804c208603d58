"""PostgreSQL: the search index covers a message's first 100,000 characters.

The index of chat/0004 held the tsvector of the whole content, and PostgreSQL
refuses a tsvector past 1 MiB: saving a very long answer failed. The index is
remade on `chat.search.POSTGRES_DOCUMENT`, which the search query uses too.
SQLite's FTS5 table has no such limit and is left as it is.
"""

from django.db import migrations

from chat.search import POSTGRES_INDEX

DROP = "DROP INDEX IF EXISTS chat_message_content_tsv"


def remake(apps, schema_editor) -> None:
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(DROP)
        for sql in POSTGRES_INDEX:
            schema_editor.execute(sql)


class Migration(migrations.Migration):
    dependencies = [("chat", "0011_queue_steer")]

    operations = [migrations.RunPython(remake, migrations.RunPython.noop)]
