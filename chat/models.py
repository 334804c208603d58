"""Chat sessions, their messages and turns (docs/architecture.md §2)."""

from django.conf import settings
from django.db import models
from django.utils import timezone


class VisibleSessions(models.Manager):
    """Sessions anyone may reach: not an import still being written
    (`chat.transfer`), which stays out of every list, search and API until its
    last chunk commits. `ChatSession.all_objects` sees those too."""

    def get_queryset(self):
        return super().get_queryset().filter(importing=False)


class ChatSession(models.Model):
    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="chat_sessions"
    )
    title = models.CharField(max_length=200, default="New chat")
    # True once the user named the chat: a generated title never replaces it.
    title_by_user = models.BooleanField(default=False)
    model = models.CharField(max_length=200, blank=True)
    system_prompt = models.TextField(blank=True)
    archived = models.BooleanField(default=False)
    # Shown above the date groups of the sidebar (`GET /api/sessions/` lists
    # pinned chats first).
    pinned = models.BooleanField(default=False)
    # Tools a person chose to "always allow in this session" (chat.approvals).
    always_allowed_tools = models.JSONField(default=list, blank=True)
    # True while an import writes it, chunk by chunk (`chat.transfer`): hidden
    # (`VisibleSessions`) until the last chunk commits, removed if one fails.
    importing = models.BooleanField(default=False)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    objects = VisibleSessions()
    all_objects = models.Manager()

    class Meta:
        ordering = ["-updated_at"]

    def __str__(self) -> str:
        return f"{self.title} ({self.pk})"

    @property
    def subject(self) -> str:
        """The journal subject of this session's runs."""
        return session_subject(self.pk)


SUBJECT_PREFIX = "chat.session:"


def session_subject(session_id: int) -> str:
    """`journal.Run.subject` of a run of session `session_id`."""
    return f"{SUBJECT_PREFIX}{session_id}"


def session_of_subject(subject: str) -> int | None:
    """The session a journal subject names, or None for any other subject."""
    if not subject.startswith(SUBJECT_PREFIX):
        return None
    tail = subject[len(SUBJECT_PREFIX) :]
    return int(tail) if tail.isdigit() else None


class Message(models.Model):
    class Role(models.TextChoices):
        USER = "user"
        ASSISTANT = "assistant"
        TOOL = "tool"
        SYSTEM = "system"

    session = models.ForeignKey(
        ChatSession, on_delete=models.CASCADE, related_name="messages"
    )
    role = models.CharField(max_length=16, choices=Role.choices)
    content = models.TextField(blank=True)
    reasoning = models.TextField(blank=True)
    tool_calls = models.JSONField(default=list, blank=True)
    tool_call_id = models.CharField(max_length=120, blank=True)
    run = models.ForeignKey(
        "journal.Run",
        on_delete=models.SET_NULL,
        null=True,
        blank=True,
        related_name="messages",
    )
    # False for a fragment kept from a stream that did not finish.
    complete = models.BooleanField(default=True)
    # Messages form a tree (`chat.tree`): an edit or a regenerated answer is a
    # new child of the same parent. None for a first message.
    parent = models.ForeignKey(
        "self",
        on_delete=models.SET_NULL,
        null=True,
        blank=True,
        related_name="children",
    )
    # Of a parent's children, the one selected last is on the active branch.
    selected_at = models.DateTimeField(default=timezone.now)
    # A user message injected into its run mid-turn (`chat.pending`, steer):
    # drawn inside that run's answer, where its `steer` event landed.
    steer = models.BooleanField(default=False)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["session", "id"]
        indexes = [models.Index(fields=["session", "id"])]

    def __str__(self) -> str:
        return f"{self.role}: {self.content[:40]}"


class StoredFile(models.Model):
    """A file's bytes, stored once per owner however many messages keep it
    (an edited question's copy, the same file sent twice, an import of it):
    attachments point here (`chat.attachments`). Counted against the owner's
    `HERMES_USER_MAX_STORED_BYTES`; removed with the last attachment to it."""

    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+"
    )
    sha256 = models.CharField(max_length=64)
    size = models.PositiveIntegerField()
    data = models.BinaryField()
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["owner", "sha256"], name="chat_storedfile_owner_sha256"
            )
        ]

    def __str__(self) -> str:
        return f"{self.sha256[:12]} ({self.size} bytes)"


class Attachment(models.Model):
    """A file sent with a user message (`chat.attachments`).

    Uploaded first (`message` None until a run's message takes it), then
    stored with its message. The bytes live in the database: bounded by
    `HERMES_ATTACHMENT_MAX_BYTES`, they go wherever messages go (backups,
    export, every web process and worker of a scale-out install) with no
    shared file storage to run (docs/architecture.md §2).
    """

    class Kind(models.TextChoices):
        TEXT = "text"  # UTF-8 text or code, inlined into the prompt
        IMAGE = "image"  # PNG, JPEG, GIF or WebP, sent to models that take images

    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="attachments"
    )
    message = models.ForeignKey(
        Message,
        on_delete=models.CASCADE,
        null=True,
        blank=True,
        related_name="attachments",
    )
    name = models.CharField(max_length=255)
    kind = models.CharField(max_length=8, choices=Kind.choices)
    # Told by the bytes for an image, never taken from the client.
    mime = models.CharField(max_length=100)
    size = models.PositiveIntegerField()
    # The bytes: `stored` (shared); `data` holds those of a file stored before
    # files were shared, and nothing for a newer one (`chat.attachments.file_bytes`).
    stored = models.ForeignKey(
        StoredFile,
        on_delete=models.RESTRICT,
        null=True,
        blank=True,
        related_name="attachments",
    )
    data = models.BinaryField(default=b"", blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["id"]
        indexes = [models.Index(fields=["owner", "message"])]

    def __str__(self) -> str:
        return f"{self.name} ({self.size} bytes)"


class Turn(models.Model):
    """What a run means to chat: one turn of a session, answered by a model.

    The journal's `Run` is generic (lease, status, journal); this row holds the
    rest and shares the run's primary key. Created with its run by
    `chat.services.run_start`; `usage` and `diagnostics` are written with the
    run's `end` (`chat.runner`).
    """

    run = models.OneToOneField(
        "journal.Run", primary_key=True, on_delete=models.CASCADE, related_name="turn"
    )
    # The run's owner again, so an Idempotency-Key is unique per user.
    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="turns"
    )
    session = models.ForeignKey(
        ChatSession, on_delete=models.CASCADE, related_name="turns"
    )
    # The message this run answers (a user message); its answer's messages
    # descend from it (`chat.tree.run_leaf`).
    reply_to = models.ForeignKey(
        Message, on_delete=models.SET_NULL, null=True, blank=True, related_name="+"
    )
    model = models.CharField(max_length=200, blank=True)
    provider = models.CharField(max_length=80, blank=True, db_index=True)
    usage = models.JSONField(default=dict, blank=True)
    diagnostics = models.JSONField(default=dict, blank=True)
    idempotency_key = models.CharField(max_length=200, blank=True)
    # SHA-256 of what the key was first used for (session and body): a reuse
    # for anything else is refused instead of answered with this run.
    idempotency_hash = models.CharField(max_length=64, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["owner", "idempotency_key"],
                condition=~models.Q(idempotency_key=""),
                name="turn_unique_idempotency_key",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.run_id} (session {self.session_id})"


class PendingMessage(models.Model):
    """A message typed while a run streams (`chat.pending`): queued for the
    next turn, or a steer into the running one, until it starts or lands.

    ``queue``: when the session's run ends (however it ends), the oldest
    pending one starts the next turn, in the transaction of that end.
    ``steer``: the run (`run`) journals it as a `steer` event and sends it to
    the model at its next model-call boundary; one still pending when the run
    ends becomes a queued one.
    """

    class Kind(models.TextChoices):
        QUEUE = "queue"
        STEER = "steer"

    class State(models.TextChoices):
        PENDING = "pending"
        STARTED = "started"  # a queued message that became a run
        LANDED = "landed"  # a steer journaled into its run
        CANCELLED = "cancelled"

    session = models.ForeignKey(
        ChatSession, on_delete=models.CASCADE, related_name="pending_messages"
    )
    kind = models.CharField(max_length=8, choices=Kind.choices)
    state = models.CharField(
        max_length=12, choices=State.choices, default=State.PENDING
    )
    content = models.TextField()
    # The model (and its provider) a queued message's turn asks, chosen when
    # it was queued; a steer that becomes queued asks its run's.
    model = models.CharField(max_length=200, blank=True)
    provider = models.CharField(max_length=80, blank=True)
    # A steer: the run it steers. Then the run it started or landed in.
    run = models.ForeignKey(
        "journal.Run",
        on_delete=models.SET_NULL,
        null=True,
        blank=True,
        related_name="+",
    )
    delivered_run = models.ForeignKey(
        "journal.Run",
        on_delete=models.SET_NULL,
        null=True,
        blank=True,
        related_name="+",
    )
    created_at = models.DateTimeField(auto_now_add=True)
    ended_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["session", "id"]
        indexes = [
            models.Index(fields=["session", "state"]),
            # The reaper's look for stranded queued messages (chat.pending)
            # reads only the few still pending, whatever the table's size.
            models.Index(
                fields=["created_at"],
                condition=models.Q(state="pending"),
                name="chat_pending_waiting_idx",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.kind} ({self.state}): {self.content[:40]}"


def turn_of(run) -> Turn | None:
    """The chat turn of a `journal.Run`, or None for a run chat did not start."""
    try:
        return run.turn
    except Turn.DoesNotExist:
        return None


class ModelRoute(models.Model):
    """Which provider serves a model, as an admin chose it in `/admin/`.

    An enabled route overrides the settings' mapping (`HERMES_PROVIDERS`,
    `OPENAI_BASE_URL`, the providers' listings) for new runs; a disabled one is
    kept but ignored. It holds names only: a provider's endpoint and key stay
    in the settings and the environment. Read at each lookup, so every process
    follows a change at its next run (chat/providers/registry.py,
    docs/operating.md "Model providers").
    """

    model = models.CharField(
        max_length=200,
        unique=True,
        help_text="the model's name as its provider knows it, e.g. claude-sonnet-4-5",
    )
    provider = models.CharField(
        max_length=80,
        help_text="the name of a provider configured in the settings",
    )
    enabled = models.BooleanField(
        default=True, help_text="off: the settings choose the provider again"
    )
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["model"]
        verbose_name = "model route"

    def __str__(self) -> str:
        return f"{self.model} → {self.provider}"

    def clean(self) -> None:
        from django.core.exceptions import ValidationError

        from .providers.registry import configs  # late: the registry imports models

        problem = model_name_problem(self.model)
        if problem:
            raise ValidationError({"model": problem})
        if self.provider not in configs():
            raise ValidationError({"provider": unknown_provider(self.provider)})


def model_name_problem(name: str) -> str:
    """Why `name` cannot be a model's name ("" when it can)."""
    if not name or not name.strip():
        return "a model needs a name"
    if any(ch.isspace() or not ch.isprintable() for ch in name):
        return "a model's name has no spaces or control characters"
    return ""


def unknown_provider(name: str) -> str:
    """The error for a provider name the settings do not configure."""
    from .providers.registry import configs

    return (
        f"no provider {name!r} is configured (configured: "
        f"{', '.join(sorted(configs()))}); providers come from the settings "
        "(OPENAI_BASE_URL, HERMES_PROVIDERS)"
    )
