"""Hooks other apps attach to without the journal knowing them."""

from django.dispatch import Signal

# Sent inside the transaction that settles a run nobody holds (reaper, admin,
# cancel of a dead run), before its `end` is appended, with `run_id` and
# `status`. A receiver may keep what the run produced and return a message id
# for the `end` payload.
run_settling = Signal()

# Sent inside the transaction that settled a run (`journal.leases.run_settle`),
# after its `end` was appended, with `run_id` and `status`; in a savepoint: a
# receiver that fails is logged and undone alone, the end stands. The chat app
# starts the session's next queued message here.
run_settled = Signal()
