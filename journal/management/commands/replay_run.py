"""`manage.py replay_run RUN`: print a run's journal, optionally following it live.

A thin shell over `journal.replay`; `--follow` reads through `journal.subscribe`,
the same core as the SSE view (in an event loop of its own, as `asyncio.run`
would), and returns after the run's `end`.
"""

from django.core.management.base import BaseCommand, CommandError

from journal import replay


class Command(BaseCommand):
    help = "Print a run's events (text, jsonl or sse); --follow waits for its end."

    def add_arguments(self, parser):
        parser.add_argument("run_id", metavar="RUN")
        parser.add_argument(
            "--after-seq",
            type=int,
            default=0,
            help="start after this seq (default: all)",
        )
        parser.add_argument("--format", choices=replay.FORMATS, default="text")
        parser.add_argument(
            "--follow",
            action="store_true",
            help="keep printing a live run until its end",
        )
        parser.add_argument(
            "--speed",
            type=float,
            default=None,
            help="replay at the recorded pace divided by X (2 = twice as fast)",
        )

    def handle(self, *args, run_id, after_seq, format, follow, speed, **options):
        if after_seq < 0:
            raise CommandError("--after-seq must be 0 or more")
        if speed is not None and not speed > 0:
            raise CommandError("--speed must be a positive number")
        try:
            replay.replay_target(run_id=run_id, after_seq=after_seq)
        except replay.ReplayError as exc:
            raise CommandError(str(exc)) from None
        render = replay.renderer(format, run_id)

        def write(records) -> None:
            self.stdout.write("".join(render(record) for record in records), ending="")
            self.stdout.flush()

        cursor = after_seq
        if speed is not None:
            cursor = replay.replay_paced(
                run_id=run_id, after_seq=cursor, speed=speed, write=write
            )
        elif not follow:
            cursor = replay.replay(run_id=run_id, after_seq=cursor, write=write)
        if follow:
            replay.follow_blocking(run_id=run_id, after_seq=cursor, write=write)
        if format == "text" and not getattr(render, "at_line_start", True):
            self.stdout.write("")  # end the last line of text
