"""Search across message text: a user's own sessions only, newest hits first.

How each database finds words (docs/architecture.md §2, "Search"):

- SQLite: the FTS5 table `chat_message_fts` that chat/0004 makes, kept in
  sync with `chat_message` by triggers. A later migration that remakes
  `chat_message` on SQLite drops those triggers with the old table;
  `fts_repair` (run after every `migrate`) puts them back and rebuilds.
- PostgreSQL: `POSTGRES_DOCUMENT`, a tsvector of the content's first
  100,000 characters, with a GIN index on the same expression (chat/0004,
  remade by chat/0012 when the expression changed).

The user's words are never handed to either query language as syntax: each
word becomes a quoted term (the last one a prefix), all of them required.
Snippets are HTML-escaped here and carry `<mark>` around hits and nothing else.
"""

import html
import re
from dataclasses import dataclass
from datetime import UTC, datetime

from django.db import connection, connections

START, STOP = "\ue000", "\ue001"  # private-use: never typed, never rendered
ROLES = ("user", "assistant")  # tool output and system prompts are not hits
MAX_TERMS = 8  # a longer query is cut here: each term costs an index lookup
SNIPPET_WORDS = 16
SNIPPET_SCAN_CHARS = 20_000  # PostgreSQL: a snippet is cut from this much
WORD = re.compile(r"\w+", re.UNICODE)

SQLITE_FTS_TABLE = [
    "CREATE VIRTUAL TABLE chat_message_fts USING fts5("
    " content, content='chat_message', content_rowid='id',"
    " tokenize='unicode61 remove_diacritics 2')",
]
SQLITE_FTS_TRIGGERS = [
    "CREATE TRIGGER IF NOT EXISTS chat_message_fts_ai AFTER INSERT ON chat_message"
    " BEGIN"
    " INSERT INTO chat_message_fts(rowid, content) VALUES (new.id, new.content);"
    " END",
    "CREATE TRIGGER IF NOT EXISTS chat_message_fts_ad AFTER DELETE ON chat_message"
    " BEGIN"
    " INSERT INTO chat_message_fts(chat_message_fts, rowid, content)"
    " VALUES ('delete', old.id, old.content);"
    " END",
    "CREATE TRIGGER IF NOT EXISTS chat_message_fts_au"
    " AFTER UPDATE OF content ON chat_message BEGIN"
    " INSERT INTO chat_message_fts(chat_message_fts, rowid, content)"
    " VALUES ('delete', old.id, old.content);"
    " INSERT INTO chat_message_fts(rowid, content) VALUES (new.id, new.content);"
    " END",
]
SQLITE_FTS_REBUILD = "INSERT INTO chat_message_fts(chat_message_fts) VALUES ('rebuild')"
# The expression `_postgres_rows` searches, so the index serves it. Angle
# brackets and ampersands become spaces first: PostgreSQL's parser would take
# `<script>` or `&amp;` for markup and leave the word in it out of the index.
# Only the first POSTGRES_INDEXED_CHARS of a message are indexed: PostgreSQL
# refuses a tsvector past 1 MiB, and a refused one would refuse the message.
POSTGRES_INDEXED_CHARS = 100_000
POSTGRES_DOCUMENT = (
    "to_tsvector('simple',"
    f" translate(left({{column}}, {POSTGRES_INDEXED_CHARS}), '<>&', '   '))"
)
POSTGRES_INDEX = [
    "CREATE INDEX chat_message_content_tsv ON chat_message"
    f" USING GIN ({POSTGRES_DOCUMENT.format(column='content')})",
]


@dataclass(frozen=True)
class Hit:
    session_id: int
    session_title: str
    message_id: int
    role: str
    created_at: datetime
    snippet: str  # HTML: escaped text with <mark>…</mark> around the hits


def search_terms(query: str) -> list[str]:
    """The words of a query, lower-cased, at most MAX_TERMS."""
    return [word.lower() for word in WORD.findall(query)][:MAX_TERMS]


def message_search(*, user, query: str, limit: int, offset: int = 0) -> list[Hit]:
    """Messages of `user`'s unarchived sessions holding every word of `query`
    (the last word as a prefix), newest first, `limit` from `offset`."""
    terms = search_terms(query)
    if not terms or not user.pk:
        return []
    if connection.vendor == "sqlite":
        rows = _sqlite_rows(terms, user.pk, limit, offset)
    elif connection.vendor == "postgresql":
        rows = _postgres_rows(terms, user.pk, limit, offset)
    else:
        return []
    return [
        Hit(
            session_id=row[0],
            session_title=row[1],
            message_id=row[2],
            role=row[3],
            created_at=_when(row[4]),
            snippet=highlighted(row[5]),
        )
        for row in rows
    ]


def highlighted(snippet: str) -> str:
    """Escape a snippet, then turn the database's hit markers into <mark>."""
    return (
        html.escape(snippet, quote=True)
        .replace(START, "<mark>")
        .replace(STOP, "</mark>")
    )


def _when(value) -> datetime:
    if isinstance(value, str):  # SQLite hands back UTC as text
        value = datetime.fromisoformat(value)
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    return value


_SELECT = (
    "SELECT s.id, s.title, m.id, m.role, m.created_at, {snippet}"
    " FROM chat_message m JOIN chat_chatsession s ON s.id = m.session_id"
)
# An import still being written (`chat.transfer`) is nobody's hit yet.
_OWNED = (
    f" s.owner_id = %s AND NOT s.archived AND NOT s.importing AND m.role IN {ROLES!r}"
)


def _sqlite_rows(terms: list[str], owner_id: int, limit: int, offset: int):
    # FTS5 strings: double quotes doubled; "…"* is a prefix query.
    quoted = ['"' + term.replace('"', '""') + '"' for term in terms]
    quoted[-1] += "*"
    snippet = f"snippet(chat_message_fts, 0, '{START}', '{STOP}', '…', {SNIPPET_WORDS})"
    sql = (
        _SELECT.format(snippet=snippet)
        + " JOIN chat_message_fts ON chat_message_fts.rowid = m.id"
        + " WHERE chat_message_fts MATCH %s AND"
        + _OWNED
        + " ORDER BY m.id DESC LIMIT %s OFFSET %s"
    )
    with connection.cursor() as cursor:
        cursor.execute(sql, [" ".join(quoted), owner_id, limit, offset])
        return cursor.fetchall()


def _postgres_rows(terms: list[str], owner_id: int, limit: int, offset: int):
    # tsquery lexemes in single quotes (quotes doubled); :* is a prefix match.
    lexemes = ["'" + term.replace("'", "''") + "'" for term in terms]
    lexemes[-1] += ":*"
    # The snippet is cut here rather than by ts_headline, whose parser drops
    # anything that looks like an HTML tag from the text it shows.
    sql = (
        _SELECT.format(snippet=f"left(m.content, {SNIPPET_SCAN_CHARS})")
        + f" WHERE {POSTGRES_DOCUMENT.format(column='m.content')}"
        + " @@ to_tsquery('simple', %s) AND"
        + _OWNED
        + " ORDER BY m.id DESC LIMIT %s OFFSET %s"
    )
    with connection.cursor() as cursor:
        cursor.execute(sql, [" & ".join(lexemes), owner_id, limit, offset])
        return [(*row[:5], marked_snippet(row[5], terms)) for row in cursor]


def marked_snippet(text: str, terms: list[str]) -> str:
    """About SNIPPET_WORDS words of `text` around its first hit, each word that
    is a term (the last term: starts with it) between START and STOP."""
    words = list(WORD.finditer(text))

    def hit(word: str) -> bool:
        word = word.lower()
        return word in terms[:-1] or word.startswith(terms[-1])

    first = next((i for i, w in enumerate(words) if hit(w.group())), 0)
    lo = max(0, first - SNIPPET_WORDS // 4)
    shown = words[lo : lo + SNIPPET_WORDS]
    if not shown:
        return text[:200]
    # Whole text at either end, so nothing is cut that need not be.
    begin = 0 if lo == 0 else shown[0].start()
    end = len(text) if shown[-1] is words[-1] else shown[-1].end()
    parts = ["…" if begin else ""]
    at = begin
    for w in shown:
        parts.append(text[at : w.start()])
        parts.append(START + w.group() + STOP if hit(w.group()) else w.group())
        at = w.end()
    parts.append(text[at:end])
    parts.append("…" if end < len(text) else "")
    return "".join(parts)


def fts_repair(*, using: str = "default", **kwargs) -> None:
    """After `migrate` on SQLite: if the FTS table exists but a trigger is gone
    (a migration remade `chat_message`, dropping them), put them back and
    rebuild the index from the messages. Nothing to do otherwise."""
    conn = connections[using]
    if conn.vendor != "sqlite":
        return
    with conn.cursor() as cursor:
        cursor.execute(
            "SELECT type, name FROM sqlite_master WHERE name LIKE 'chat_message_fts%'"
        )
        names = {name for _, name in cursor.fetchall()}
        if "chat_message_fts" not in names or len(names & _TRIGGERS) == 3:
            return
        for sql in [*SQLITE_FTS_TRIGGERS, SQLITE_FTS_REBUILD]:
            cursor.execute(sql)


_TRIGGERS = {"chat_message_fts_ai", "chat_message_fts_ad", "chat_message_fts_au"}
