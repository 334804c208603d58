"""Hooks other apps attach to without the journal knowing them."""

from django.dispatch import Signal

# Sent inside the transaction that settles a run nobody holds (reaper, admin,
# cancel of a dead run), before its `end` is appended, with `run_id` and
# `status`. A receiver may keep what the run produced and return a message id
# for the `end` payload.
run_settling = Signal()
