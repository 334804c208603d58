"""The journal admin: runs filterable and settleable, the journal read-only.
See docs/architecture.md §7.

Built for a journal of millions of events: no page counts the journal
(`NoCountPaginator`, `show_full_result_count = False`), no filter lists the
distinct values of an event column, and a run's page reads only its first
`JOURNAL_PREVIEW` events (one indexed query), with a link to the rest. Nothing
here writes events except through `journal.leases.run_settle`. A run's
subject is shown as text. The chat app adds its turn's columns and the
"cancel" action (`chat.admin`): the journal knows nothing of chat.
"""

import json
import re
from typing import ClassVar

from django.contrib import admin, messages
from django.core.paginator import Paginator
from django.db import transaction
from django.http import JsonResponse
from django.urls import path, reverse
from django.utils.functional import cached_property
from django.utils.html import format_html, format_html_join

from . import wire
from .cursor import Cursor, Verdict, decide_for_run
from .events import EVENT_TYPES
from .leases import run_settle
from .models import Event, Run, WorkerHeartbeat
from .publish import publish_on_commit
from .store import read_after, read_timed

JOURNAL_PREVIEW = 50  # events rendered on a run's page; events.json pages the rest
SETTLED_BY_ADMIN = "settled-by-admin"


class NoCountPaginator(Paginator):
    """Pages a large table without COUNT(*): reads one row past the page instead.

    `count` is the rows up to the current page, plus one when another page
    follows, so the admin offers "next" without ever counting the table.
    """

    def __init__(self, object_list, per_page, *, number: int = 1, **kwargs):
        super().__init__(object_list, per_page, **kwargs)
        self.number = max(1, number)
        self.offset = (self.number - 1) * per_page

    @cached_property
    def _rows(self) -> list:
        return list(self.object_list[self.offset : self.offset + self.per_page + 1])

    @cached_property
    def count(self) -> int:
        return self.offset + len(self._rows)

    def page(self, number):
        number = self.validate_number(number)
        if number == self.number:
            return self._get_page(self._rows[: self.per_page], number, self)
        return super().page(number)


# Past any real table's end, and small enough that the offset it makes fits
# SQLite's and PostgreSQL's 64-bit integers (a larger one failed in the query).
MAX_PAGE = 10**9


def page_number(request) -> int:
    raw = request.GET.get("p", "1").strip()
    if not re.fullmatch(r"-?[0-9]{1,12}", raw):
        return 1
    return min(int(raw), MAX_PAGE)


def pretty_json(value) -> str:
    """JSON text or a value, indented for reading, HTML-escaped by the caller."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            return value
    return json.dumps(value, indent=2, ensure_ascii=False, sort_keys=True)


def pre(value) -> str:
    """A payload, pretty-printed; styled by `PAYLOAD_CSS` (the site's
    Content-Security-Policy refuses inline styles)."""
    return format_html('<pre class="journal-payload">{}</pre>', pretty_json(value))


# The stylesheet of `pre`: every admin page showing payloads lists it in its Media.
PAYLOAD_CSS = {"all": ("journal/admin.css",)}


class EventTypeFilter(admin.SimpleListFilter):
    """The declared event types: no `SELECT DISTINCT type` over the journal."""

    title = "type"
    parameter_name = "type"

    def lookups(self, request, model_admin):
        return [(name, name) for name in EVENT_TYPES]

    def queryset(self, request, queryset):
        return queryset.filter(type=self.value()) if self.value() else queryset


class ReadOnlyLargeTableAdmin(admin.ModelAdmin):
    """Read-only and paged without COUNT(*): for tables too large to count."""

    show_full_result_count = False

    class Media:
        css = PAYLOAD_CSS

    def get_paginator(
        self, request, queryset, per_page, orphans=0, allow_empty_first_page=True
    ):
        return NoCountPaginator(queryset, per_page, number=page_number(request))

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False


@admin.register(Run)
class RunAdmin(admin.ModelAdmin):
    class Media:
        css = PAYLOAD_CSS

    list_display: tuple[str, ...] = (
        "id",
        "owner",
        "subject",
        "status",
        "terminal_state",
        "last_seq",
        "created_at",
        "ended_at",
    )
    list_select_related: ClassVar[tuple[str, ...]] = ("owner",)
    list_filter: ClassVar[tuple[str, ...]] = ("status", "terminal_state", "created_at")
    search_fields = ("=id",)
    search_help_text = "A run id, exactly (run_…), or an event id (run_…:seq)."
    show_full_result_count = False
    show_facets = admin.ShowFacets.NEVER
    actions = ["settle_interrupted"]
    fieldsets: ClassVar[tuple] = (
        (None, {"fields": ("id", "owner", "subject", "status", "terminal_state")}),
        ("Outcome", {"fields": ("error_category", "error_message")}),
        ("Times", {"fields": ("created_at", "started_at", "ended_at", "pruned_at")}),
        (
            "Lease",
            {
                "fields": (
                    "lease_owner",
                    "lease_expires_at",
                    "fencing_token",
                    "cancel_requested_at",
                    "last_seq",
                )
            },
        ),
        ("Journal", {"fields": ("journal",)}),
    )
    readonly_fields: ClassVar[tuple[str, ...]] = (
        "id",
        "owner",
        "subject",
        "status",
        "terminal_state",
        "error_category",
        "error_message",
        "created_at",
        "started_at",
        "ended_at",
        "pruned_at",
        "lease_owner",
        "lease_expires_at",
        "fencing_token",
        "cancel_requested_at",
        "last_seq",
        "journal",
    )

    # Runs are created by the app that owns their subject and written by the
    # journal alone.
    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False  # retention is `prune_journal`; a run's row outlives its journal

    def get_search_results(self, request, queryset, search_term):
        """An exact id (or an event id `run_…:seq`): a primary-key lookup, no scan."""
        term = search_term.strip().split(":")[0]
        return (queryset.filter(id=term) if term else queryset), False

    def has_settle_permission(self, request) -> bool:
        return request.user.has_perm("journal.change_run")

    @admin.display(description=f"journal (first {JOURNAL_PREVIEW} events)")
    def journal(self, run: Run):
        if run.pruned_at is not None:
            return (
                f"Pruned by retention at {run.pruned_at:%Y-%m-%d %H:%M}; "
                "what the run produced is kept by the app that started it."
            )
        timed = read_timed(run_id=run.id, after_seq=0, limit=JOURNAL_PREVIEW)
        rows = format_html_join(
            "",
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            (
                (r.seq, r.type, f"{at:%H:%M:%S.%f}"[:-3], pre(r.payload))
                for r, at in timed
            ),
        )
        more = ""
        if run.last_seq > len(timed):
            more = format_html(
                '<p>{} more: <a href="{}?after_seq={}">events.json</a> · '
                '<a href="{}?run__id__exact={}">event list</a></p>',
                run.last_seq - len(timed),
                reverse("admin:journal_run_events_json", args=[run.id]),
                len(timed),
                reverse("admin:journal_event_changelist"),
                run.id,
            )
        return format_html(
            "<table><thead><tr><th>seq</th><th>type</th><th>time</th><th>payload</th>"
            "</tr></thead><tbody>{}</tbody></table>{}",
            rows,
            more,
        )

    @admin.action(
        description="Settle as interrupted (settled-by-admin)", permissions=["settle"]
    )
    def settle_interrupted(self, request, queryset):
        settled = 0
        for run in queryset.filter(status__in=Run.ACTIVE):
            with transaction.atomic():
                records = run_settle(
                    run_id=run.id,
                    status=Run.Status.INTERRUPTED,
                    terminal_state=SETTLED_BY_ADMIN,
                    by=f"admin:{request.user.pk}",
                    only_if_lost=False,
                )
                if records:
                    publish_on_commit(run.id, records)
            if records:
                settled += 1
                self.log_change(
                    request, run, "Settled as interrupted (settled-by-admin)."
                )
        skipped = queryset.count() - settled
        self.message_user(
            request, f"{settled} run(s) settled as interrupted.", messages.SUCCESS
        )
        if skipped:
            self.message_user(
                request, f"{skipped} run(s) had already ended.", messages.WARNING
            )

    def get_urls(self):
        events_json = self.admin_site.admin_view(self.events_json_view)
        return [
            path(
                "<path:object_id>/events.json",
                events_json,
                name="journal_run_events_json",
            ),
            *super().get_urls(),
        ]

    def events_json_view(self, request, object_id: str):
        """A page of a run's journal for staff: `?after_seq=&limit=` as the API's."""
        if not self.has_view_permission(request):
            return JsonResponse({"error": "permission denied"}, status=403)
        run = Run.objects.filter(id=object_id).first()
        if run is None:
            return JsonResponse({"error": f"no run {object_id}"}, status=404)
        try:
            params = wire.parse_page_params(request.GET)  # the API's rules exactly
        except wire.BadPageParam as exc:
            return JsonResponse(exc.body(), status=400)
        if decide_for_run(run, Cursor(params.after_seq)).verdict is Verdict.GONE:
            return JsonResponse(
                {"error": "this run's events were pruned by retention"}, status=410
            )
        records = read_after(
            run_id=run.id, after_seq=params.after_seq, limit=params.limit
        )
        return JsonResponse(
            wire.page(
                run_id=run.id,
                status=run.status,
                last_seq=run.last_seq,
                records=records,
                limit=params.limit,
            ),
            json_dumps_params={"ensure_ascii": False},
        )


@admin.register(Event)
class EventAdmin(ReadOnlyLargeTableAdmin):
    """The journal, read-only: appends belong to `journal.store` alone."""

    list_display = (
        "event_id",
        "run_link",
        "seq",
        "type",
        "created_at",
        "payload_preview",
    )
    list_filter = (EventTypeFilter,)
    show_full_result_count = False
    show_facets = admin.ShowFacets.NEVER
    list_max_show_all = 0  # "show all" would read the whole journal
    fields = ("event_id", "run_link", "seq", "type", "created_at", "payload_pretty")
    readonly_fields = fields

    def get_ordering(self, request):
        # One run's events in seq order ride the (run, seq) index.
        return ("seq",) if "run__id__exact" in request.GET else ("-id",)

    @admin.display(description="id")
    def event_id(self, event: Event) -> str:
        return wire.event_id(event.run_id, event.seq)

    @admin.display(description="run")
    def run_link(self, event: Event):
        url = reverse("admin:journal_run_change", args=[event.run_id])
        return format_html('<a href="{}">{}</a>', url, event.run_id)

    @admin.display(description="payload")
    def payload_preview(self, event: Event) -> str:
        return event.payload if len(event.payload) <= 120 else event.payload[:119] + "…"

    @admin.display(description="payload")
    def payload_pretty(self, event: Event):
        return pre(event.payload)


@admin.register(WorkerHeartbeat)
class WorkerHeartbeatAdmin(admin.ModelAdmin):
    list_display = ("worker_id", "seen_at", "active_runs")
    ordering = ("-seen_at",)

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False
