"""The chat admin (DESIGN §7): sessions with their transcript, messages, run cancel.

Writes go through `chat.services` (renaming or deleting a session tells the
owner's open tabs; deleting cancels its active run). Transcripts are records:
messages are read-only here. API tokens are passwords and are never shown.
"""

from django.contrib import admin, messages
from django.db import transaction
from django.urls import reverse
from django.utils.html import format_html
from rest_framework.authtoken.models import TokenProxy

from journal.admin import ReadOnlyLargeTableAdmin, RunAdmin, pre
from journal.models import Run

from .models import ChatSession, Message
from .services import run_cancel, session_delete, session_update

# DRF's token admin lists every key in clear (and a token's str() is its key):
# no admin page shows them. Keys are made and revoked by `drf_create_token`
# or the account page.
if admin.site.is_registered(TokenProxy):
    admin.site.unregister(TokenProxy)


def _run_link(run_id: str | None):
    if not run_id:
        return "-"
    return format_html(
        '<a href="{}">{}</a>',
        reverse("admin:journal_run_change", args=[run_id]),
        run_id,
    )


# What a message shows, inline in its session and on its own page.
MESSAGE_FIELDS = (
    "role",
    "content",
    "reasoning",
    "tool_calls_pretty",
    "tool_call_id",
    "complete",
    "run_link",
    "created_at",
)


class MessageInline(admin.TabularInline):
    model = Message
    fields = ("id", *MESSAGE_FIELDS)
    readonly_fields = fields
    ordering = ("id",)
    extra = 0
    can_delete = False
    show_change_link = True

    def has_add_permission(self, request, obj=None):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    @admin.display(description="tool calls")
    def tool_calls_pretty(self, message: Message):
        return pre(message.tool_calls) if message.tool_calls else ""

    @admin.display(description="run")
    def run_link(self, message: Message):
        return _run_link(message.run_id)


@admin.register(ChatSession)
class ChatSessionAdmin(admin.ModelAdmin):
    list_display = (
        "id",
        "title",
        "owner",
        "model",
        "archived",
        "created_at",
        "updated_at",
    )
    list_select_related = ("owner",)
    list_filter = ("archived", "created_at")
    search_fields = ("title", "=owner__username")
    show_full_result_count = False
    show_facets = admin.ShowFacets.NEVER
    fields = (
        "owner",
        "title",
        "model",
        "system_prompt",
        "archived",
        "created_at",
        "updated_at",
        "runs_link",
    )
    readonly_fields = ("owner", "created_at", "updated_at", "runs_link")
    inlines = [MessageInline]

    def has_add_permission(self, request):
        return False  # sessions belong to users; they start them (or import_session)

    @admin.display(description="runs")
    def runs_link(self, session: ChatSession):
        url = reverse("admin:journal_run_changelist")
        return format_html(
            '<a href="{}?session__id__exact={}">runs of this session</a>',
            url,
            session.pk,
        )

    def save_model(self, request, obj, form, change):
        changed = {name: form.cleaned_data[name] for name in form.changed_data}
        session_update(session=obj, **changed)

    def delete_model(self, request, obj):
        session_delete(session=obj)

    def delete_queryset(self, request, queryset):
        for session in queryset:
            session_delete(session=session)


@admin.register(Message)
class MessageAdmin(ReadOnlyLargeTableAdmin):
    list_display = (
        "id",
        "session_link",
        "role",
        "short_content",
        "complete",
        "run_link",
        "created_at",
    )
    list_filter = ("role", "complete")
    show_full_result_count = False
    show_facets = admin.ShowFacets.NEVER
    list_max_show_all = 0
    fields = ("session_link", *MESSAGE_FIELDS)
    readonly_fields = fields

    def get_ordering(self, request):
        return ("id",) if "session__id__exact" in request.GET else ("-id",)

    @admin.display(description="session")
    def session_link(self, message: Message):
        url = reverse("admin:chat_chatsession_change", args=[message.session_id])
        return format_html('<a href="{}">{}</a>', url, message.session_id)

    @admin.display(description="content")
    def short_content(self, message: Message) -> str:
        text = message.content
        return text if len(text) <= 80 else text[:79] + "…"

    @admin.display(description="tool calls")
    def tool_calls_pretty(self, message: Message):
        return pre(message.tool_calls) if message.tool_calls else ""

    @admin.display(description="run")
    def run_link(self, message: Message):
        return _run_link(message.run_id)


# The journal's run admin, plus "cancel": a chat service (it also signals the
# worker holding the run), which the journal may not import.
admin.site.unregister(Run)


@admin.register(Run)
class ChatRunAdmin(RunAdmin):
    actions = ["cancel_runs", *RunAdmin.actions]

    @admin.action(
        description="Cancel (as the user's stop button does)", permissions=["settle"]
    )
    def cancel_runs(self, request, queryset):
        cancelled = 0
        for run in queryset.filter(status__in=Run.ACTIVE):
            with transaction.atomic():
                run_cancel(run=run)
            cancelled += 1
            self.log_change(request, run, "Cancel requested.")
        self.message_user(
            request,
            f"Cancel requested for {cancelled} active run(s); "
            "a running one stops within a second and ends as cancelled.",
            messages.SUCCESS,
        )
