"""The chat admin: sessions with their transcript, messages, turns, run cancel,
and the provider chosen per model (model routes). See docs/architecture.md §7.

Writes go through `chat.services` (renaming or deleting a session tells the
owner's open tabs; deleting cancels its active run). Transcripts are records:
messages are read-only here. API tokens are passwords and are never shown.
"""

from django import forms
from django.contrib import admin, messages
from django.db import transaction
from django.urls import reverse
from django.utils.html import format_html
from rest_framework.authtoken.models import TokenProxy

from chat.approvals import NotWaiting, approval_decide, approval_pending
from journal.admin import PAYLOAD_CSS, ReadOnlyLargeTableAdmin, RunAdmin, pre
from journal.models import Run

from .models import (
    Attachment,
    ChatSession,
    Message,
    ModelRoute,
    PendingMessage,
    turn_of,
)
from .providers import registry
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
    "parent_id",  # the tree of branches (chat.tree); an id, so no query per row
    "selected_at",
    "role",
    "content",
    "reasoning",
    "tool_calls_pretty",
    "tool_call_id",
    "complete",
    "steer",  # sent into its run mid-turn (chat.pending)
    "run_link",
    "created_at",
)


class MessageInline(admin.TabularInline):
    model = Message

    class Media:
        css = PAYLOAD_CSS

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


class PendingMessageInline(admin.TabularInline):
    """Messages typed while a run streamed that wait to start or land
    (chat.pending; at most `MAX_PENDING`): read-only here, the owner cancels
    them from the page or the API."""

    model = PendingMessage
    verbose_name_plural = "pending queued and steer messages"
    fields = ("id", "kind", "state", "content", "run", "delivered_run", "created_at")
    readonly_fields = fields
    ordering = ("id",)
    extra = 0
    can_delete = False

    def get_queryset(self, request):
        return super().get_queryset(request).filter(state=PendingMessage.State.PENDING)

    def has_add_permission(self, request, obj=None):
        return False

    def has_change_permission(self, request, obj=None):
        return False


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
    inlines = [PendingMessageInline, MessageInline]

    def has_add_permission(self, request):
        return False  # sessions belong to users; they start them (or import_session)

    @admin.display(description="runs")
    def runs_link(self, session: ChatSession):
        url = reverse("admin:journal_run_changelist")
        return format_html(
            '<a href="{}?subject__exact={}">runs of this session</a>',
            url,
            session.subject,
        )

    def save_model(self, request, obj, form, change):
        changed = {name: form.cleaned_data[name] for name in form.changed_data}
        session_update(session=obj, **changed)

    def delete_model(self, request, obj):
        session_delete(session=obj)

    def delete_queryset(self, request, queryset):
        for session in queryset:
            session_delete(session=session)


class AttachmentInline(admin.TabularInline):
    """A message's files: name, kind, type and size (the bytes are the
    owner's; they stay behind `GET /api/attachments/<id>/content/`)."""

    model = Attachment
    fields = ("id", "name", "kind", "mime", "size", "created_at")
    readonly_fields = fields
    extra = 0
    can_delete = False
    show_change_link = True

    def get_queryset(self, request):
        return super().get_queryset(request).defer("data")

    def has_add_permission(self, request, obj=None):
        return False

    def has_change_permission(self, request, obj=None):
        return False


@admin.register(Attachment)
class AttachmentAdmin(ReadOnlyLargeTableAdmin):
    list_display = ("id", "name", "kind", "mime", "size", "owner", "message_link")
    list_select_related = ("owner",)
    list_filter = ("kind",)
    search_fields = ("name", "=owner__username")
    show_facets = admin.ShowFacets.NEVER
    list_max_show_all = 0
    fields = ("name", "kind", "mime", "size", "owner", "message_link", "created_at")
    readonly_fields = fields
    ordering = ("-id",)

    def get_queryset(self, request):
        return super().get_queryset(request).defer("data")

    @admin.display(description="message")
    def message_link(self, attachment: Attachment):
        if attachment.message_id is None:
            return "- (not sent yet)"
        url = reverse("admin:chat_message_change", args=[attachment.message_id])
        return format_html('<a href="{}">{}</a>', url, attachment.message_id)


@admin.register(Message)
class MessageAdmin(ReadOnlyLargeTableAdmin):
    list_display = (
        "id",
        "session_link",
        "parent_id",
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
    inlines = [AttachmentInline]

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


# The journal's run admin, plus what the run means to chat (its turn: session,
# model, usage, diagnostics) and "cancel": a chat service (it also signals the
# worker holding the run), which the journal may not import.
admin.site.unregister(Run)

TURN_FIELDS = (
    "session_link",
    "turn_provider",
    "turn_model",
    "usage_pretty",
    "diagnostics_pretty",
    "pending_approval",
)


@admin.register(Run)
class ChatRunAdmin(RunAdmin):
    actions = ["cancel_runs", "approve_pending", "deny_pending", *RunAdmin.actions]
    list_display = (
        *RunAdmin.list_display[:3],
        "session_link",
        "turn_provider",
        "turn_model",
        *RunAdmin.list_display[3:],
    )
    list_select_related = ("owner", "turn")
    list_filter = (
        *RunAdmin.list_filter[:2],
        "turn__provider",
        "turn__model",
        *RunAdmin.list_filter[2:],
    )
    fieldsets = (
        RunAdmin.fieldsets[0],
        ("Turn", {"fields": TURN_FIELDS}),
        *RunAdmin.fieldsets[1:],
    )
    readonly_fields = (*RunAdmin.readonly_fields, *TURN_FIELDS)

    def get_queryset(self, request):
        # The change page reads the turn too; the changelist applies
        # list_select_related only to a queryset that has none yet.
        return super().get_queryset(request).select_related(*self.list_select_related)

    @admin.display(description="session", ordering="turn__session_id")
    def session_link(self, run: Run):
        turn = turn_of(run)
        if turn is None:
            return "-"
        url = reverse("admin:chat_chatsession_change", args=[turn.session_id])
        return format_html('<a href="{}">{}</a>', url, turn.session_id)

    @admin.display(description="provider", ordering="turn__provider")
    def turn_provider(self, run: Run) -> str:
        """The provider's name, and the API it speaks when that is another word."""
        turn = turn_of(run)
        if turn is None:
            return "-"
        config = registry.configs().get(turn.provider)
        if config is None or config.kind in (turn.provider, "openai"):
            return turn.provider
        return f"{turn.provider} ({config.kind})"

    @admin.display(description="pending approval")
    def pending_approval(self, run: Run):
        """The tool call a waiting run waits for (decide with the list's actions)."""
        if run.status != Run.Status.WAITING:
            return "-"
        return pre(approval_pending(run_id=run.id))

    @admin.display(description="model", ordering="turn__model")
    def turn_model(self, run: Run) -> str:
        turn = turn_of(run)
        return turn.model if turn else "-"

    @admin.display(description="usage")
    def usage_pretty(self, run: Run):
        turn = turn_of(run)
        return pre(turn.usage) if turn and turn.usage else "none reported"

    @admin.display(description="diagnostics")
    def diagnostics_pretty(self, run: Run):
        turn = turn_of(run)
        return pre(turn.diagnostics) if turn else "-"

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

    @admin.action(description="Approve the pending tool call", permissions=["settle"])
    def approve_pending(self, request, queryset):
        self._decide(request, queryset, approve=True)

    @admin.action(description="Deny the pending tool call", permissions=["settle"])
    def deny_pending(self, request, queryset):
        self._decide(request, queryset, approve=False)

    def _decide(self, request, queryset, *, approve: bool) -> None:
        """A decision on each selected waiting run, journaled as the page's."""
        decided = 0
        for run in queryset.filter(status=Run.Status.WAITING):
            try:
                decision = approval_decide(run=run, approve=approve)
            except NotWaiting:
                continue
            decided += 1
            self.log_change(
                request, run, f"{decision['decision']} {decision['name']} (admin)"
            )
        verb = "Approved" if approve else "Denied"
        self.message_user(
            request,
            f"{verb} the pending tool call of {decided} waiting run(s).",
            messages.SUCCESS,
        )


def _provider_label(name: str) -> str:
    """A provider as the admin names it: its name, and its API when that is
    another word. Never its endpoint or key (those stay in the settings)."""
    config = registry.configs().get(name)
    if config is None:
        return name
    kind = "demo" if name == "demo" else config.kind
    return name if kind in (name, "openai") else f"{name} ({kind})"


def _provider_choices() -> list[tuple[str, str]]:
    return [(name, _provider_label(name)) for name in registry.configs()]


class ModelRouteForm(forms.ModelForm):
    """A route's provider is picked from the configured ones (the settings' of
    now); a name they do not configure is refused by `ModelRoute.clean`, in
    its words."""

    class Meta:
        model = ModelRoute
        fields = ("model", "provider", "enabled")

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        choices = _provider_choices()
        current = self.instance.provider
        if current and current not in dict(choices):
            choices.append((current, f"{current} (not configured)"))
        field = self.fields["provider"]
        field.widget = forms.Select(choices=choices)
        field.help_text = (
            "Providers come from the settings (OPENAI_BASE_URL, HERMES_PROVIDERS), "
            "with their endpoints and keys."
        )


@admin.register(ModelRoute)
class ModelRouteAdmin(admin.ModelAdmin):
    """Which provider serves a model; overrides the settings for new runs."""

    form = ModelRouteForm
    list_display = (
        "model",
        "provider_shown",
        "enabled",
        "in_force",
        "settings_choice",
        "updated_at",
    )
    list_filter = ("enabled", "provider")
    search_fields = ("model",)
    readonly_fields = ("in_force", "settings_choice", "updated_at")

    def get_fields(self, request, obj=None):
        shown = ("model", "provider", "enabled")
        return shown if obj is None else (*shown, *self.readonly_fields)

    @admin.display(description="provider", ordering="provider")
    def provider_shown(self, route: ModelRoute) -> str:
        return _provider_label(route.provider)

    @admin.display(description="in force")
    def in_force(self, route: ModelRoute) -> str:
        """Whether new runs of the model follow this route, and why not."""
        if route.provider not in registry.configs():
            return "no: the provider is not configured in the settings"
        return "yes" if route.enabled else "no: disabled"

    @admin.display(description="without this route")
    def settings_choice(self, route: ModelRoute) -> str:
        """The provider the settings choose when no route is in force."""
        found = registry.configs()
        return _provider_label(registry.settings_provider_for(route.model, found))
