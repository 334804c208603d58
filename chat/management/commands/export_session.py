"""`manage.py export_session SESSION_ID [--output FILE]`: a session as JSON Lines.

A thin shell over `chat.transfer`; `import_session` reads the file back.
"""

from django.core.management.base import BaseCommand, CommandError

from chat.models import ChatSession
from chat.transfer import write_export
from hermes_site.private_files import create_private


class Command(BaseCommand):
    help = (
        "Write a session and its messages as JSON Lines (to stdout or --output FILE)."
    )

    def add_arguments(self, parser):
        parser.add_argument("session_id", metavar="SESSION_ID", type=int)
        parser.add_argument(
            "--output", "-o", metavar="FILE", help="write here, not stdout"
        )

    def handle(self, *args, session_id, output, **options):
        session = ChatSession.objects.filter(pk=session_id).first()
        if session is None:
            raise CommandError(f"no session {session_id}")
        if not output:
            write_export(session=session, out=self.stdout)  # lines end in \n
            return
        try:
            with create_private(output) as out:  # 0600: a whole conversation
                count = write_export(session=session, out=out)
        except FileExistsError:
            raise CommandError(f"{output} exists; not overwriting it") from None
        except OSError as exc:
            raise CommandError(f"cannot write {output}: {exc.strerror}") from None
        self.stderr.write(
            f"exported session {session_id}: {count} message(s) to {output}"
        )
