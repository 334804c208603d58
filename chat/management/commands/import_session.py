"""`manage.py import_session FILE --owner USERNAME`: a session from `export_session`.

A thin shell over `chat.transfer`: all or nothing, a bad line names its number.
"""

import sys

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError

from chat.transfer import TransferError, session_import


class Command(BaseCommand):
    help = "Create a session for --owner from a JSON Lines export ('-' reads stdin)."
    stealth_options = ("stdin",)

    def add_arguments(self, parser):
        parser.add_argument("file", metavar="FILE")
        parser.add_argument("--owner", required=True, metavar="USERNAME")

    def handle(self, *args, file, owner, **options):
        user = get_user_model().objects.filter(username=owner).first()
        if user is None:
            raise CommandError(f"no user {owner!r}")
        try:
            if file == "-":
                session, count = session_import(
                    owner=user, lines=options.get("stdin") or sys.stdin
                )
            else:
                with open(file, encoding="utf-8") as lines:
                    session, count = session_import(owner=user, lines=lines)
        except TransferError as exc:
            raise CommandError(f"{file}: {exc}; nothing was imported") from None
        except (OSError, UnicodeDecodeError) as exc:
            raise CommandError(f"cannot read {file}: {exc}") from None
        self.stdout.write(
            f"imported session {session.pk} for {owner}: {count} message(s)"
        )
