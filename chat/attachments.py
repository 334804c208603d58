"""Files sent with a message: what is taken, how it is stored, how a model
sees it (docs/architecture.md §2, docs/operating.md "Attachments").

- Text and code (an allowed extension or a `text/*` type, and valid UTF-8)
  are inlined into the prompt, each in a fenced block headed by its name.
- Images (PNG, JPEG, GIF, WebP, told by their first bytes, never by the name
  alone) go to a model that takes images as OpenAI content parts
  (`image_url` with a `data:` URL); the Anthropic and Responses providers
  translate those parts into their own shapes. A model that does not take
  images is sent a line saying an image was left out instead.

Limits (`settings.HERMES`): `ATTACHMENT_MAX_BYTES` per file,
`ATTACHMENT_MAX_FILES` per message, `MAX_MESSAGE_CHARS` per text file.
A refusal is an `AttachmentRefused` with the HTTP status and the setting that
bounds it.
"""

import base64
import hashlib
import re
import unicodedata
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import timedelta
from pathlib import PurePosixPath

from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import RestrictedError, Sum
from django.db.models.signals import post_delete
from django.dispatch import receiver
from django.utils import timezone

from .models import Attachment, Message, StoredFile

#: Read as text or code when `HERMES_ATTACHMENT_TEXT_EXTENSIONS` is unset.
TEXT_EXTENSIONS = (
    "txt md markdown rst csv tsv log json jsonl yaml yml toml ini cfg conf env "
    "xml html htm css scss svg py pyi ipynb js mjs cjs ts tsx jsx java kt kts c h "
    "cc cpp cxx hpp hh cs go rs rb php pl pm lua r jl swift m mm scala clj ex "
    "exs erl hs ml sh bash zsh fish ps1 bat sql graphql proto tf hcl dockerfile "
    "makefile gradle vue svelte tex bib diff patch"
).split()
#: Client-declared types read as text besides `text/*`.
TEXT_MIMES = frozenset(
    {
        "application/json",
        "application/x-ndjson",
        "application/xml",
        "application/javascript",
        "application/x-sh",
        "application/x-yaml",
        "application/toml",
        "application/sql",
    }
)
IMAGE_TYPES = {
    "png": "image/png",
    "jpeg": "image/jpeg",
    "gif": "image/gif",
    "webp": "image/webp",
}
IMAGE_EXTENSIONS = {"png", "jpg", "jpeg", "gif", "webp"}
#: Uploads not yet sent with a message, per user; older ones are dropped.
PENDING_MAX = 20
PENDING_KEEP = timedelta(days=1)
NAME_MAX = 255  # chat.Attachment.name


class AttachmentRefused(Exception):
    """A file or a message's files that cannot be taken.

    `status` is the HTTP answer (413 too large, 415 a type not taken, 400,
    404, 429); `limit` names the setting that bounds it, if one does.
    """

    def __init__(self, message: str, *, status: int = 400, limit: str = ""):
        super().__init__(message)
        self.status = status
        self.limit = limit

    def body(self) -> dict:
        return {"error": str(self), **({"limit": self.limit} if self.limit else {})}


def max_bytes() -> int:
    return settings.HERMES["ATTACHMENT_MAX_BYTES"]


def max_files() -> int:
    return settings.HERMES["ATTACHMENT_MAX_FILES"]


def text_extensions() -> list[str]:
    return settings.HERMES.get("ATTACHMENT_TEXT_EXTENSIONS") or TEXT_EXTENSIONS


def clean_name(name: str) -> str:
    """A file name to show and store: its last path part, no control
    characters, at most `NAME_MAX` characters; "file" if nothing is left."""
    base = PurePosixPath(str(name).replace("\\", "/")).name
    base = "".join(ch for ch in base if unicodedata.category(ch)[0] != "C").strip()
    if len(base) > NAME_MAX:
        stem, dot, ext = base.rpartition(".")
        keep = NAME_MAX - len(ext) - 1 if dot and len(ext) < 16 else NAME_MAX
        base = base[:keep] + (f".{ext}" if keep < NAME_MAX else "")
    return base or "file"


def extension(name: str) -> str:
    """The lower-case extension, or the whole name for `Makefile`-like names."""
    stem, dot, ext = name.rpartition(".")
    return (ext if dot and stem else name).lower()


def image_type(data: bytes) -> str | None:
    """The image MIME type told by the first bytes, or None."""
    if data.startswith(b"\x89PNG\r\n\x1a\n"):
        return IMAGE_TYPES["png"]
    if data.startswith(b"\xff\xd8\xff"):
        return IMAGE_TYPES["jpeg"]
    if data.startswith((b"GIF87a", b"GIF89a")):
        return IMAGE_TYPES["gif"]
    if len(data) >= 12 and data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return IMAGE_TYPES["webp"]
    return None


@dataclass(frozen=True)
class Checked:
    """An accepted file: its kind, its type, and its bytes."""

    name: str
    kind: str
    mime: str
    data: bytes


def check_file(*, name: str, declared: str, data: bytes) -> Checked:
    """Accept a file as text or an image, or raise `AttachmentRefused`."""
    name = clean_name(name)
    limit = max_bytes()
    if len(data) > limit:
        raise AttachmentRefused(
            f"{name}: {len(data)} bytes is more than the {limit} bytes a file may have",
            status=413,
            limit="HERMES_ATTACHMENT_MAX_BYTES",
        )
    if not data:
        raise AttachmentRefused(f"{name}: the file is empty")
    ext = extension(name)
    declared = (declared or "").split(";")[0].strip().lower()
    mime = image_type(data)
    if mime is not None:
        return Checked(name, Attachment.Kind.IMAGE, mime, data)
    if ext in IMAGE_EXTENSIONS or (declared.startswith("image/") and ext != "svg"):
        raise AttachmentRefused(
            f"{name}: not a PNG, JPEG, GIF or WebP image (its bytes say otherwise)",
            status=415,
        )
    if ext not in text_extensions() and not (
        declared.startswith("text/") or declared in TEXT_MIMES
    ):
        raise AttachmentRefused(
            f"{name}: this type of file is not taken; attach text or code "
            "(.txt, .md, .py, .json, …) or a PNG, JPEG, GIF or WebP image",
            status=415,
            limit="HERMES_ATTACHMENT_TEXT_EXTENSIONS",
        )
    text = _utf8(name, data)
    chars = settings.HERMES["MAX_MESSAGE_CHARS"]
    if len(text) > chars:
        raise AttachmentRefused(
            f"{name}: {len(text)} characters is more than the {chars} a text "
            "file may have",
            status=413,
            limit="HERMES_MAX_MESSAGE_CHARS",
        )
    return Checked(name, Attachment.Kind.TEXT, "text/plain; charset=utf-8", data)


def _utf8(name: str, data: bytes) -> str:
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError:
        text = None
    if text is None or "\x00" in text:
        raise AttachmentRefused(
            f"{name}: not UTF-8 text (binary files other than images are not taken)",
            status=415,
        )
    return text


def upload(*, owner, name: str, declared: str, data: bytes) -> Attachment:
    """Store a checked file of `owner`, not yet sent with a message.

    Uploads older than `PENDING_KEEP` that no message took are dropped here;
    more than `PENDING_MAX` waiting ones answer 429.
    """
    checked = check_file(name=name, declared=declared, data=data)
    pending = Attachment.objects.filter(owner=owner, message__isnull=True)
    pending.filter(created_at__lt=timezone.now() - PENDING_KEEP).delete()
    if pending.count() >= PENDING_MAX:
        raise AttachmentRefused(
            f"{PENDING_MAX} files are already waiting to be sent; send or remove "
            "some first",
            status=429,
            limit="attachments_pending",
        )
    return Attachment.objects.create(
        owner=owner,
        name=checked.name,
        kind=checked.kind,
        mime=checked.mime,
        size=len(checked.data),
        stored=store_bytes(owner=owner, data=checked.data),
    )


# --- stored bytes: once per owner, bounded per owner ------------------------------


def max_stored_bytes() -> int:
    return settings.HERMES["USER_MAX_STORED_BYTES"]


def stored_bytes(*, owner) -> int:
    """The file bytes `owner` keeps: each shared file once, and the files
    stored before files were shared (their own `data`)."""
    owner_id = getattr(owner, "pk", owner)
    shared = StoredFile.objects.filter(owner_id=owner_id).aggregate(n=Sum("size"))
    legacy = Attachment.objects.filter(
        owner_id=owner_id, stored__isnull=True
    ).aggregate(n=Sum("size"))
    return (shared["n"] or 0) + (legacy["n"] or 0)


def usage(*, owner) -> dict:
    """What the account page shows: bytes stored and the bound."""
    return {"used_bytes": stored_bytes(owner=owner), "limit_bytes": max_stored_bytes()}


def check_storage(*, owner, adding: int) -> None:
    """Refuse (413, naming the setting) `adding` new bytes past the bound."""
    limit = max_stored_bytes()
    used = stored_bytes(owner=owner)
    if adding and used + adding > limit:
        raise AttachmentRefused(
            f"storing {adding} more bytes of files would pass the {limit} bytes "
            f"one user may keep ({used} stored); delete chats with files to "
            "free some",
            status=413,
            limit="HERMES_USER_MAX_STORED_BYTES",
        )


def store_bytes(*, owner, data: bytes, checked: bool = False) -> StoredFile:
    """`data` as one of `owner`'s stored files: the one already holding the
    same bytes, else a new one (within the bound unless `checked`)."""
    digest = hashlib.sha256(data).hexdigest()
    owner_id = getattr(owner, "pk", owner)
    found = StoredFile.objects.filter(owner_id=owner_id, sha256=digest).first()
    if found is not None:
        return found
    if not checked:
        check_storage(owner=owner, adding=len(data))
    try:
        with transaction.atomic():
            return StoredFile.objects.create(
                owner_id=owner_id, sha256=digest, size=len(data), data=data
            )
    except IntegrityError:  # the same bytes stored meanwhile
        return StoredFile.objects.get(owner_id=owner_id, sha256=digest)


def file_bytes(attachment: Attachment) -> bytes:
    """An attachment's bytes, wherever they are stored."""
    if attachment.stored_id is not None:
        return bytes(attachment.stored.data)  # type: ignore[union-attr]
    return bytes(attachment.data)


@receiver(post_delete, sender=Attachment)
def _drop_unkept_bytes(sender, instance: Attachment, **kwargs) -> None:
    """The last attachment to a stored file takes its bytes with it."""
    if instance.stored_id is None:
        return
    unkept = StoredFile.objects.filter(pk=instance.stored_id, attachments=None)
    try:
        with transaction.atomic():
            unkept.delete()
    except RestrictedError:  # kept again meanwhile
        pass


def pending_for(*, owner, ids: list[int]) -> list[Attachment]:
    """`owner`'s uploads `ids`, in that order, none sent yet; refused with
    404 for an id that is not theirs and 400 for one already sent."""
    if len(ids) > max_files():
        raise AttachmentRefused(
            f"{len(ids)} files is more than the {max_files()} a message may have",
            limit="HERMES_ATTACHMENT_MAX_FILES",
        )
    if len(set(ids)) != len(ids):
        raise AttachmentRefused("the same attachment is named twice")
    found = Attachment.objects.filter(owner=owner, pk__in=ids).defer("data").in_bulk()
    for pk in ids:
        if pk not in found:
            raise AttachmentRefused(f"no attachment {pk}", status=404)
        if found[pk].message_id is not None:
            raise AttachmentRefused(f"attachment {pk} was already sent with a message")
    return [found[pk] for pk in ids]


def has_images(attachments: Iterable[Attachment]) -> bool:
    return any(a.kind == Attachment.Kind.IMAGE for a in attachments)


def copy_to(*, source: Message, target: Message) -> None:
    """An edited question keeps the files of the version it replaces: the
    same stored bytes, not a copy of them (a file stored before files were
    shared is moved to a stored file first, at no cost to the bound)."""
    copies = []
    for a in source.attachments.all():
        if a.stored_id is None:
            a.stored = store_bytes(owner=a.owner_id, data=bytes(a.data), checked=True)
            a.data = b""
            a.save(update_fields=["stored", "data"])
        copies.append(
            Attachment(
                owner_id=a.owner_id,
                message=target,
                name=a.name,
                kind=a.kind,
                mime=a.mime,
                size=a.size,
                stored_id=a.stored_id,
            )
        )
    Attachment.objects.bulk_create(copies)


def info(attachment: Attachment) -> dict:
    """An attachment as the API shows it (no bytes: `url` serves them)."""
    from django.urls import reverse

    return {
        "id": attachment.pk,
        "name": attachment.name,
        "kind": attachment.kind,
        "mime": attachment.mime,
        "size": attachment.size,
        "url": reverse("api-attachment-content", args=[attachment.pk]),
    }


# --- what a model is sent -------------------------------------------------------


def fenced(name: str, text: str) -> str:
    """A text file as a block of the prompt: its name, then its text in a
    fence longer than any backtick run inside it."""
    longest = max((len(run) for run in re.findall(r"`+", text)), default=0)
    fence = "`" * max(3, longest + 1)
    language = extension(name) if "." in name else ""
    return f"File: {name}\n{fence}{language}\n{text.rstrip(chr(10))}\n{fence}"


def data_url(attachment: Attachment) -> str:
    encoded = base64.b64encode(file_bytes(attachment)).decode("ascii")
    return f"data:{attachment.mime};base64,{encoded}"


def user_content(
    content: str, attachments: list[Attachment], *, vision: bool
) -> str | list[dict]:
    """A user message's `content` on the wire (OpenAI chat completions).

    Without files, the text itself. Text files follow the text, fenced.
    Images make the content a list of parts, the text first, when the model
    takes images; otherwise a line says each one was left out.
    """
    blocks = [content] if content else []
    images = []
    for attachment in attachments:
        if attachment.kind == Attachment.Kind.TEXT:
            text = file_bytes(attachment).decode("utf-8-sig", errors="replace")
            blocks.append(fenced(attachment.name, text))
        elif vision:
            images.append(attachment)
        else:
            blocks.append(
                f"[Image {attachment.name} left out: this model does not take images]"
            )
    text = "\n\n".join(blocks)
    if not images:
        return text
    parts: list[dict] = [{"type": "text", "text": text}] if text else []
    parts += [
        {"type": "image_url", "image_url": {"url": data_url(image)}} for image in images
    ]
    return parts


#: Ids per `IN (...)` query: under SQLite's oldest variable limit (999), so a
#: branch of any length is read in several small queries, never one that the
#: database refuses (issue: a long branch answered 503 on every read).
IDS_PER_QUERY = 500


def by_message(message_ids: Iterable[int]) -> dict[int, list[Attachment]]:
    """The attachments of these messages, in upload order, by message id."""
    found: dict[int, list[Attachment]] = {}
    ids = list(message_ids)
    for start in range(0, len(ids), IDS_PER_QUERY):
        part = ids[start : start + IDS_PER_QUERY]
        rows = Attachment.objects.filter(message_id__in=part).select_related("stored")
        for attachment in rows:
            if attachment.message_id is not None:
                found.setdefault(attachment.message_id, []).append(attachment)
    for files in found.values():
        files.sort(key=lambda a: a.pk)
    return found
