"""Sync tools for tests, importable by name so tool processes can run them.

Each stands for a tool with a flaw the tool process must contain. No Django
imports: a tool process imports this module without setting Django up.
"""

from typing import Any


def read_file(args: dict[str, Any]) -> str:
    """A tool that would touch the machine (it only pretends to)."""
    return "secret contents"


def crash(args: dict[str, Any]) -> str:
    raise RuntimeError("kaput")


def gil_bomb(args: dict[str, Any]) -> int:
    """One C call that holds the GIL for minutes: 10**(10**9) before rounding."""
    return round(1, -(10**9))


def memory_bomb(args: dict[str, Any]) -> int:
    """Asks for 4 GiB at once."""
    return len(bytearray(4 << 30))


def exit_process(args: dict[str, Any]) -> str:
    """Ends its own process mid-call, as a crash of the interpreter would."""
    import os

    os._exit(3)


def spin_after_marker(args: dict[str, Any]) -> None:
    """Writes ``args["marker"]`` (so a test knows it runs), then spins forever."""
    with open(args["marker"], "w") as marker:
        marker.write("running")
    while True:
        pass


def wait_for_release(args: dict[str, Any]) -> str:
    """Writes ``args["marker"]`` (so a test knows it runs), then answers once
    the file ``args["release"]`` exists: a tool step the test ends at will."""
    import os
    import time

    with open(args["marker"], "w") as marker:
        marker.write("running")
    while not os.path.exists(args["release"]):
        time.sleep(0.01)
    return "released"
