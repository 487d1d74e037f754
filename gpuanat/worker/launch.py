"""The rank launcher: one distributed run, started with torchrun, seen by gpuanat as one child.

    python -m gpuanat.worker.launch --events-fd FD --nproc N -- WORKER-ARGS...

gpuanat starts this process (it holds the lifeline, in a process group of its own); it starts `python -P -m
torch.distributed.run --standalone --nproc-per-node N --no-python python -u -P -m gpuanat.worker WORKER-ARGS
--rank-socket PATH` in its own group. torchrun starts every rank in a session of its own and passes it no
descriptor, so each rank connects to a Unix socket this launcher listens on (in a private folder): its first line
says which rank it is, then come its protocol events. The launcher forwards them to gpuanat's events pipe, each
wrapped as `Ranked`.

The socket is also each rank's lifeline: the launcher never writes to it, so a rank reads end-of-file exactly
when the launcher is gone, and ends its own group (gpuanat.worker.lifeline). When gpuanat goes, this launcher's
lifeline ends torchrun and every rank it knows of. SIGINT or SIGTERM (gpuanat's stop) is passed to torchrun as
SIGTERM, which torchrun passes to every rank; a rank stops like a single-process run.

Exit code: torchrun's; 130 when stopped and every rank stopped. A rank that ended without saying `done` or
`error` (killed, crashed in C) is reported as an `error` event of that rank. After a rank failed either way, the
ranks still running `RANK_LOST_GRACE_S` later are killed: on GPUs they wait in a collective for the lost peer, and
torchrun would only SIGKILL them after its 30 s (on 2 H200s a killed rank's peer held its GPU 31 s).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any

from gpuanat.core.run.python_command import python_module_command
from gpuanat.core.vocabulary.protocol import Done, Error, EventLines, Malformed, Ranked
from gpuanat.worker.events import EventWriter, ParentGone
from gpuanat.worker.lifeline import hold_lifeline

EXIT_STOPPED = 130
RANK_HEADER_MAX_BYTES = 4096
RANKS_GONE_GRACE_S = 10.0
"""After torchrun exited, how long the ranks' connections may stay open before the launcher stops waiting."""
RANK_LOST_GRACE_S = 5.0
"""After a rank failed (an error, or it ended without a word), how long the others may take to end by themselves
(gloo's collectives fail at once; NCCL's wait) before the launcher kills them."""


def torchrun_command(nproc: int, worker_args: list[str], socket_path: str) -> list[str]:
    """torchrun on this host alone: a free port, no restarts (a failed rank fails the run). torchrun's own `-m`
    would start each rank as `python -u -m gpuanat.worker`, the current folder first on its `sys.path`; with
    `--no-python` it runs the command given whole, so each rank is `python -u -P -m gpuanat.worker`."""
    return [
        *python_module_command(
            "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}", "--max-restarts=0", "--no-python"
        ),
        *python_module_command("gpuanat.worker", *worker_args, "--rank-socket", socket_path, unbuffered=True),
    ]


class _Forwarder:
    """Reads each rank's connection and forwards its events, whole lines, one writer at a time."""

    def __init__(self, writer: EventWriter, on_rank_lost: Any = lambda rank: None) -> None:
        self._writer = writer
        self._on_rank_lost = on_rank_lost
        self._lock = threading.Lock()
        self.finished: dict[int, str] = {}
        """Rank -> how it ended ("done" or "error"), from its own events."""
        self.connected: dict[int, int] = {}
        """Rank -> pid, from its header."""
        self.threads: list[threading.Thread] = []
        self.parent_gone = False
        self.ended_silently: list[int] = []
        """Ranks whose connection closed before they said how they ended, in the order they closed: the first is
        the one that died (killed, a crash in native code); torchrun then ends the others."""

    def send(self, event: Any) -> None:
        with self._lock:
            if self.parent_gone:
                return
            try:
                self._writer.emit(event)
            except ParentGone:
                self.parent_gone = True

    def serve(self, listener: socket.socket) -> None:
        while True:
            try:
                connection, _ = listener.accept()
            except OSError:  # closed: no more ranks
                return
            thread = threading.Thread(target=self._read_rank, args=(connection,), daemon=True)
            self.threads.append(thread)
            thread.start()

    def _read_rank(self, connection: socket.socket) -> None:
        with connection:
            header = _read_header(connection)
            if header is None:
                return
            rank, pid = header
            self.connected[rank] = pid
            lines = EventLines()
            while True:
                try:
                    chunk = connection.recv(1 << 16)
                except OSError:
                    chunk = b""
                events = lines.feed(chunk) if chunk else lines.finish()
                for event in events:
                    if isinstance(event, Ranked):  # a rank sends its own events: the parent refuses an envelope's
                        event = Malformed("", "a rank sent a Ranked envelope of its own")
                    if isinstance(event, Done):
                        self.finished[rank] = "done"
                    elif isinstance(event, Error):
                        self.finished[rank] = "error"
                        self._on_rank_lost(rank)
                    self.send(Ranked(rank, event))
                if not chunk:
                    if rank not in self.finished:
                        with self._lock:
                            self.ended_silently.append(rank)
                        self._on_rank_lost(rank)
                    return


def _read_header(connection: socket.socket) -> tuple[int, int] | None:
    """The rank's first line, {"rank": R, "pid": P}; None when it is not that."""
    data = b""
    while b"\n" not in data and len(data) < RANK_HEADER_MAX_BYTES:
        try:
            chunk = connection.recv(1)
        except OSError:
            return None
        if not chunk:
            return None
        data += chunk
    try:
        header = json.loads(data)
        rank, pid = header["rank"], header["pid"]
    except (ValueError, KeyError, TypeError):
        return None
    if not (isinstance(rank, int) and isinstance(pid, int)) or rank < 0:
        return None
    return rank, pid


def main(argv: list[str] | None = None) -> int:
    hold_lifeline()
    parser = argparse.ArgumentParser(prog="python -m gpuanat.worker.launch", description=__doc__)
    parser.add_argument("--events-fd", type=int, required=True)
    parser.add_argument("--nproc", type=int, required=True)
    parser.add_argument("worker_args", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    worker_args = args.worker_args[1:] if args.worker_args[:1] == ["--"] else args.worker_args
    stop_requested = threading.Event()
    killed: list[int] = []
    """Ranks this launcher killed after another failed."""
    failed: list[int] = []
    """Ranks that failed (an error, or ended without a word), in the order seen."""

    def kill_survivors() -> None:
        if stop_requested.is_set():
            return
        for rank, pid in list(forwarder.connected.items()):
            if rank not in forwarder.finished and rank not in forwarder.ended_silently:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(pid, signal.SIGKILL)  # torchrun starts each rank in a session of its own
                    killed.append(rank)

    def rank_lost(rank: int) -> None:
        failed.append(rank)
        if len(failed) == 1 and not stop_requested.is_set():  # one deadline, from the first failure
            timer = threading.Timer(RANK_LOST_GRACE_S, kill_survivors)
            timer.daemon = True
            timer.start()

    forwarder = _Forwarder(EventWriter(args.events_fd), on_rank_lost=rank_lost)
    with tempfile.TemporaryDirectory(prefix="gpuanat-ranks-") as folder:
        socket_path = str(Path(folder) / "ranks.sock")
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(socket_path)
        listener.listen(max(8, args.nproc))
        threading.Thread(target=forwarder.serve, args=(listener,), daemon=True).start()
        torchrun = subprocess.Popen(torchrun_command(args.nproc, worker_args, socket_path), stdin=subprocess.DEVNULL)

        def pass_stop(signum: int, frame: Any) -> None:
            stop_requested.set()
            with contextlib.suppress(ProcessLookupError):
                torchrun.send_signal(signal.SIGTERM)

        signal.signal(signal.SIGINT, pass_stop)
        signal.signal(signal.SIGTERM, pass_stop)
        returncode = torchrun.wait()
        for thread in list(forwarder.threads):
            thread.join(RANKS_GONE_GRACE_S)
        listener.close()
    ended = forwarder.ended_silently
    # the rank that ended first is the cause, so it is reported first (the parent takes the first of equal kinds)
    missing = sorted(
        (rank for rank in range(args.nproc) if rank not in forwarder.finished),
        key=lambda rank: ended.index(rank) if rank in ended else len(ended) + rank,
    )
    if missing and not stop_requested.is_set():
        for position, rank in enumerate(missing):
            pid = forwarder.connected.get(rank)
            named = f"rank {rank}{f' (pid {pid})' if pid else ''}"
            if rank in killed:
                how = (
                    f"was ended by gpuanat {RANK_LOST_GRACE_S:g} s after rank {failed[0]} failed (its collectives "
                    "would have waited for it)"
                )
            else:
                never = "" if pid is not None else " (it never connected)"
                how = f"ended without finishing{never}{f' after rank {missing[0]} did' if position else ''}"
            forwarder.send(
                Ranked(
                    rank,
                    Error(
                        kind="exited", message=(f"{named} {how}; torchrun exited with code {returncode} — see the log")
                    ),
                )
            )
    if stop_requested.is_set():
        return EXIT_STOPPED
    return returncode if returncode >= 0 else 128 - returncode


if __name__ == "__main__":
    sys.exit(main())
