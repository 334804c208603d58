"""A session's messages as a tree, and its active branch (docs/architecture.md §2).

Every message but a first one has a `parent`. An edited question is a new
user message beside the old one (same parent); a regenerated answer is a new
run whose messages hang under the same question. Of the children of one
parent (and of a session's first messages), the one with the latest
`selected_at` (then the highest id) is active: new messages are selected when
they are made, and `message_select` selects an older one. A run in progress
counts as a child of its question made when it started, so until its first
message a regenerated answer already hides the older ones. The active branch
is the path from the active first message down through active children.

The model is sent one path only: a run's own (`run_path`), whatever the page
shows meanwhile.
"""

import itertools
import json
from dataclasses import dataclass, field
from datetime import datetime

from django.db import connection, transaction
from django.db.models.expressions import RawSQL
from django.utils import timezone

from journal.models import Run

from .models import Message, Turn


@dataclass
class Tree:
    """The shape of one session's messages, read in one query."""

    parent: dict[int, int | None] = field(default_factory=dict)
    children: dict[int | None, list[int]] = field(default_factory=dict)
    rank: dict[int, tuple[datetime, int]] = field(default_factory=dict)
    # question id -> when the active run answering it started
    pending: dict[int, datetime] = field(default_factory=dict)

    @classmethod
    def of_session(cls, session_id: int) -> "Tree":
        tree = cls()
        rows = (
            Message.objects.filter(session_id=session_id)
            .order_by("id")
            .values_list("id", "parent_id", "selected_at")
        )
        for pk, parent, selected in rows.iterator(chunk_size=2000):
            tree.parent[pk] = parent
            tree.rank[pk] = (selected, pk)
        for pk, up in tree.parent.items():
            # A parent outside the session (never made so) counts as none.
            top = up if up in tree.parent else None
            tree.parent[pk] = top
            tree.children.setdefault(top, []).append(pk)
        active = Turn.objects.filter(
            session_id=session_id,
            run__status__in=Run.ACTIVE,
            reply_to__isnull=False,
        ).values_list("reply_to_id", "run__created_at")
        tree.pending = dict(active)
        return tree

    def active_child(self, parent: int | None) -> int | None:
        children = self.children.get(parent)
        best = max(children, key=self.rank.__getitem__) if children else None
        started = self.pending.get(parent) if parent is not None else None
        if best is not None and started is not None and self.rank[best][0] < started:
            return None  # the run in progress is the newest answer
        return best

    def active_path(self) -> list[int]:
        path: list[int] = []
        node = self.active_child(None)
        while node is not None:
            path.append(node)
            node = self.active_child(node)
        return path

    def path_to(self, pk: int) -> list[int]:
        """The ids from the first message down to `pk`, inclusive."""
        path: list[int] = []
        node: int | None = pk
        while node is not None and len(path) <= len(self.parent):
            path.append(node)
            node = self.parent.get(node)
        path.reverse()
        return path

    def versions(self, pk: int) -> list[int]:
        """Its parent's children (itself included) in id order."""
        return self.children.get(self.parent.get(pk), [pk])

    def siblings(self, pk: int) -> tuple[int, int]:
        """(1-based position among its parent's children in id order, how many)."""
        group = self.versions(pk)
        return group.index(pk) + 1, len(group)


def active_leaf(*, session_id: int) -> int | None:
    """The last message of the session's active branch (None: no messages)."""
    path = Tree.of_session(session_id).active_path()
    return path[-1] if path else None


#: Ids per statement where a branch's ids must be named: under SQLite's oldest
#: variable limit (999). A branch is as long as its session, and one statement
#: naming all of it fails past the database's limit (32,766 on SQLite, 65,535
#: on PostgreSQL) — on every read of the session, as if the database were out.
IDS_PER_QUERY = 500


def ids_in(ids: list[int]) -> RawSQL:
    """The subquery `pk__in=ids_in(ids)`: the ids passed as one parameter (a
    JSON array on SQLite, an array on PostgreSQL), whatever their number."""
    if connection.vendor == "postgresql":
        return RawSQL("SELECT unnest(%s::bigint[])", [list(ids)])
    return RawSQL("SELECT value FROM json_each(%s)", [json.dumps(list(ids))])


def branch_last_run(*, session_id: int) -> str | None:
    """The newest run of the active branch: of those that made its messages,
    and those that answered its last message and left none (a failed run).

    The session's runs are read newest first until one is on the branch (the
    newest run of a session usually is): no statement names the branch's ids.
    """
    path = Tree.of_session(session_id).active_path()
    if not path:
        return None
    on_branch = set(path)
    runs = (
        Run.objects.filter(turn__session_id=session_id)
        .order_by("-created_at", "-id")
        .values_list("id", "turn__reply_to_id")
    )
    for start in itertools.count(0, IDS_PER_QUERY):
        page = list(runs[start : start + IDS_PER_QUERY])
        if not page:
            return None
        ids = [run_id for run_id, _ in page]
        made = Message.objects.filter(session_id=session_id, run_id__in=ids)
        branch_runs = {
            run_id for run_id, pk in made.values_list("run_id", "id") if pk in on_branch
        }
        for run_id, reply_to in page:
            if reply_to == path[-1] or run_id in branch_runs:
                return run_id
    return None


def run_leaf(*, run_id: str) -> int | None:
    """Where the run's next message goes: under its last one, else under the
    message it answers.

    One statement: every run's end asks (`chat.runner`).
    """
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT COALESCE((SELECT MAX(id) FROM {Message._meta.db_table}"
            " WHERE run_id = %s),"
            f" (SELECT reply_to_id FROM {Turn._meta.db_table} WHERE run_id = %s))",
            [run_id, run_id],
        )
        return cursor.fetchone()[0]


def run_path(*, session_id: int, run_id: str | None) -> list[int]:
    """The branch a run is sent: from the first message to where it continues;
    without a run, the session's active branch."""
    tree = Tree.of_session(session_id)
    leaf = run_leaf(run_id=run_id) if run_id else None
    return tree.path_to(leaf) if leaf is not None else tree.active_path()


def message_select(*, message: Message, now: datetime | None = None) -> list[int]:
    """Make the branch through `message` active; return the new active branch.

    Its ancestors are selected too, so the branch holds from the top; below
    it, the children selected last stay active.
    """
    tree = Tree.of_session(message.session_id)
    path = tree.path_to(message.pk)
    when = now or timezone.now()
    with transaction.atomic():
        for start in range(0, len(path), IDS_PER_QUERY):
            part = path[start : start + IDS_PER_QUERY]
            Message.objects.filter(pk__in=part).update(selected_at=when)
    tree = Tree.of_session(message.session_id)
    return tree.active_path()
