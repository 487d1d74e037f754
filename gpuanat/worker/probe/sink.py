"""Where a probe's events go when it was given no `emit`: to gpuanat's pipe when gpuanat launched the script
(`gpuanat run --script` installs it, `install_default_emit`), else to this process's private publication file,
which `gpuanat watch PID` reads (`gpuanat.core.measure.publish`). Publishing that fails once is off for the
process, with one warning.
"""

from __future__ import annotations

import atexit
import os
import sys
from collections.abc import Callable

from gpuanat.core.measure.publish import Publisher, PublishRefused, publication_dirs
from gpuanat.core.vocabulary.protocol import Event

EVENTS_FD_ENV = "GPUANAT_EVENTS_FD"

_installed_emit: Callable[[Event], None] | None = None
"""Where callbacks built without `emit` send their events when gpuanat launched the script."""

_publisher: Publisher | None = None

_publishing_failed = False


def install_default_emit(emit: Callable[[Event], None] | None) -> None:
    """Make callbacks constructed without `emit` send their events to `emit` (gpuanat's script launcher
    calls this with its events pipe); None restores publishing to the per-user file."""
    global _installed_emit
    _installed_emit = emit


def warn(message: str) -> None:
    print(f"gpuanat: {message}", file=sys.stderr, flush=True)


def remove_publication(publisher: Publisher) -> None:
    if publisher.pid == os.getpid():  # not in forked DataLoader workers
        publisher.close(remove=True)


def publish(event: Event) -> None:
    """Publish to this process's file; the first failure turns publishing off for the process."""
    global _publisher, _publishing_failed
    if _publishing_failed:
        return
    try:
        if _publisher is None or _publisher.pid != os.getpid():
            _publisher = Publisher(publication_dirs(os.environ, os.getuid())[0])
            atexit.register(remove_publication, _publisher)
        _publisher.publish(event)
    except (OSError, PublishRefused) as error:
        _publishing_failed = True
        warn(f"publishing for `gpuanat watch` turned off: {error}")


def published_path() -> str | None:
    """The file this process publishes to, once it has published something."""
    return str(_publisher.path) if _publisher is not None and not _publishing_failed else None


def default_emit(publish_events: bool) -> Callable[[Event], None]:
    """Where a probe built without `emit` sends its events: the installed sink, else this process's publication
    (unless `publish_events` is False: nowhere)."""
    return _installed_emit or (publish if publish_events else (lambda event: None))
