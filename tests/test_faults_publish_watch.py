"""Faults a tester found in publishing for `gpuanat watch`, reproduced with real processes and real files.

The publishing side is a real Python process that publishes through the probe's own path (what
`AnatomyCallback` calls), into a private XDG_RUNTIME_DIR under tmp_path; the test prepares the publication
directory once it knows the process's PID, before the process publishes. The watching side is the real
`python -m gpuanat watch PID --json`, its memory measured with psutil while it runs.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import psutil
import pytest
from conftest import REPO, cli_env

from gpuanat.core.vocabulary.protocol import MAX_EVENT_LINE_BYTES, Hello, ModelInfo, ProbeBands, Step, encode

MB = 1000 * 1000

# Prints its PID, waits for a line (the test prepares the directory), publishes one event the way the probe
# does, prints where it published ("None" when publishing was refused), waits for a line, exits normally
# (atexit runs the publisher's cleanup).
PUBLISHER = textwrap.dedent(
    """
    import os, sys
    print(os.getpid(), flush=True)
    sys.stdin.readline()
    from gpuanat.core.vocabulary.protocol import Hello
    from gpuanat.worker.probe.sink import publish, published_path
    publish(Hello(pid=os.getpid(), versions={}, device="cpu", device_name=None, config={}))
    print(published_path(), flush=True)
    sys.stdin.readline()
    """
)


class PublishingProcess:
    def __init__(self, tmp_path: Path) -> None:
        self.runtime_dir = tmp_path / "runtime"
        self.runtime_dir.mkdir(mode=0o700, exist_ok=True)
        self.directory = self.runtime_dir / "gpuanat"
        self.directory.mkdir(mode=0o700, exist_ok=True)
        env = {**cli_env(None), "XDG_RUNTIME_DIR": str(self.runtime_dir)}
        self.process = subprocess.Popen(
            [sys.executable, "-c", PUBLISHER],
            env=env,
            cwd=REPO,
            text=True,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        assert self.process.stdout is not None
        self.pid = int(self.process.stdout.readline())
        self.path = self.directory / f"{self.pid}.jsonl"

    def publish(self) -> str:
        """Let it publish; where it published, or "None"."""
        assert self.process.stdin is not None and self.process.stdout is not None
        self.process.stdin.write("\n")
        self.process.stdin.flush()
        return self.process.stdout.readline().strip()

    def exit(self) -> list[str]:
        """Let it exit normally; the gpuanat lines it wrote on stderr."""
        _, stderr = self.process.communicate("\n", timeout=60)
        assert self.process.returncode == 0, stderr
        return [line for line in stderr.splitlines() if line.startswith("gpuanat:")]


@pytest.fixture
def victim(tmp_path: Path) -> Path:
    """Someone's file that the publisher must never write into, truncate or remove."""
    path = tmp_path / "victim.txt"
    path.write_text("precious data\n")
    return path


def other_users_file(path: Path) -> None:
    path.write_text("another user's data\n")
    os.chown(path, 65534, 65534)


@pytest.mark.parametrize(
    ("what", "prepare", "words"),
    [
        ("a hard link to another file", lambda path, victim: os.link(victim, path), "has 2 hard links"),
        ("a symlink to another file", lambda path, victim: path.symlink_to(victim), "is a symbolic link"),
        ("a directory", lambda path, victim: path.mkdir(), "is a directory"),
        ("another user's file", lambda path, victim: other_users_file(path), "belongs to uid 65534"),
        (
            "a file written since the process started",
            lambda path, victim: path.write_text("someone's\n"),
            "was written since process",
        ),
    ],
)
def test_what_is_already_at_the_publication_path_is_refused_and_left_untouched(tmp_path, victim, what, prepare, words):
    if what == "another user's file" and os.getuid() != 0:
        pytest.skip("giving a file to another user needs root")
    publisher = PublishingProcess(tmp_path)
    prepare(publisher.path, victim)
    before = os.lstat(publisher.path)
    content = publisher.path.read_bytes() if publisher.path.is_file() else None
    assert publisher.publish() == "None"
    (warning,) = publisher.exit()
    assert "publishing for `gpuanat watch` turned off" in warning
    assert str(publisher.path) in warning and words in warning and "left untouched" in warning
    # untouched, also by the cleanup at exit
    after = os.lstat(publisher.path)
    assert (after.st_ino, after.st_mode, after.st_uid, after.st_mtime_ns) == (
        before.st_ino,
        before.st_mode,
        before.st_uid,
        before.st_mtime_ns,
    )
    if content is not None:
        assert publisher.path.read_bytes() == content
    assert victim.read_text() == "precious data\n"


def test_a_file_left_by_an_earlier_process_with_the_same_pid_is_replaced(tmp_path):
    publisher = PublishingProcess(tmp_path)
    publisher.path.write_text("left by an earlier process\n")
    publisher.path.chmod(0o600)
    os.utime(publisher.path, (1_000, 1_000))
    assert publisher.publish() == str(publisher.path)
    (line,) = publisher.path.read_text().splitlines()
    assert json.loads(line)["type"] == "hello" and json.loads(line)["pid"] == publisher.pid
    assert publisher.exit() == []
    assert not publisher.path.exists()


def test_the_cleanup_at_exit_removes_only_the_file_it_created(tmp_path):
    publisher = PublishingProcess(tmp_path)
    assert publisher.publish() == str(publisher.path)
    replacement = publisher.directory / "replacement"
    replacement.write_text("put there after the publisher created its file\n")
    os.replace(replacement, publisher.path)
    assert publisher.exit() == []
    assert publisher.path.read_text() == "put there after the publisher created its file\n"


def test_files_of_dead_processes_are_removed_only_when_plainly_ours(tmp_path, victim):
    """At its first publication a process removes what processes killed before it left: only regular files
    of ours with no other name."""
    dead = [
        int(
            subprocess.run(
                [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True, check=True
            ).stdout
        )
        for _ in range(5)
    ]
    publisher = PublishingProcess(tmp_path)
    directory = publisher.directory
    left = {name: directory / name for name in (f"{dead[0]}.jsonl", f"{dead[1]}.jsonl.new")}
    for path in left.values():
        path.write_text("left by a killed process\n")
    kept = {"hard link": directory / f"{dead[2]}.jsonl", "symlink": directory / f"{dead[3]}.jsonl"}
    os.link(victim, kept["hard link"])
    kept["symlink"].symlink_to(victim)
    if os.getuid() == 0:
        kept["another user's"] = directory / f"{dead[4]}.jsonl"
        other_users_file(kept["another user's"])
    assert publisher.publish() == str(publisher.path)
    assert publisher.exit() == []
    assert not any(path.exists() for path in left.values())
    assert all(os.path.lexists(path) for path in kept.values())
    assert victim.read_text() == "precious data\n" and os.stat(victim).st_nlink == 2


# --- `gpuanat watch PID --json` reading a hostile publication ------------------------------------------------

BANDS = ProbeBands(
    weights_bytes=4_000,
    gradients_bytes=4_000,
    optimizer_state_bytes=8_000,
    activations_bytes=1_234,
    activations_method="saved_tensors",
    batch_bytes=64,
    measured_at_step=2,
    optimizer_state_at_forward_end_bytes=8_000,
)
VALID = [
    Hello(pid=0, versions={"torch": "test"}, device="cpu", device_name=None, config={"batch_size": 4}),
    ModelInfo(params=1_000, trainable_params=1_000, weights_bytes=4_000, dtype="float32", total_steps=100),
    Step(step=1, samples=4, tokens=128, step_time_s=0.5, elapsed_s=0.5),
    Step(step=2, samples=8, tokens=256, step_time_s=0.5, elapsed_s=1.0, bands=BANDS),
    Step(step=3, samples=12, tokens=384, step_time_s=0.5, elapsed_s=1.5),
]


def long_line(prefix: bytes, size_bytes: int) -> list[bytes]:
    """A line of `size_bytes` in 1 MB pieces (written piece by piece: the test holds none of it whole)."""
    filler = size_bytes - len(prefix)
    return [prefix, *([b"x" * MB] * (filler // MB)), b"x" * (filler % MB)]


MALFORMED: list[list[bytes]] = [
    long_line(b'{"v":1,"type":"hello","junk":"', 5 * MB),
    long_line(b'{"v":1,"type":"model","junk":"', 100 * MB),  # the size that cost 636 MB of RSS
    [b"this is not JSON"],
    [b'{"v":1,"type":["x"]}'],
    [b'{"v":1,"type":"step","step":1,"samples":4,"tokens":8,"step_time_s":0.1,"elapsed_s":0.1,"bands":5}'],
    [b'{"v":1,"type":"step","step":"9","samples":"4","tokens":"8","step_time_s":"0.1","elapsed_s":"0.1"}'],
    [b'{"v":1,"type":"step","x":' + b"[" * 1000 + b"]" * 1000 + b"}"],
    [b"\xff\xfe\xfd not UTF-8 \xc3\x28"],
]
UNTERMINATED_TAIL = long_line(b'{"v":1,"type":"done","junk":"', 5 * MB)

# Reports its PID and stays alive; the test writes its publication, as the probe would (private, its own).
SLEEPER = "import os, time; print(os.getpid(), flush=True); time.sleep(600)"


def write_hostile_publication(path: Path) -> int:
    """Valid events, each after a malformed line, the last malformed lines after them and an unterminated tail;
    the number of malformed lines, the tail included."""
    pieces: list[list[bytes]] = []
    garbage = iter(MALFORMED)
    for event in VALID:
        pieces.append(next(garbage))
        pieces.append([encode(event).rstrip(b"\n")])
    pieces.extend(garbage)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as out:
        for line in pieces:
            out.writelines(line)
            out.write(b"\n")
        out.writelines(UNTERMINATED_TAIL)
    return len(pieces) - len(VALID) + 1


def peak_rss_while_running(process: subprocess.Popen[str]) -> int:
    peak = 0
    watched = psutil.Process(process.pid)
    while process.poll() is None:
        try:
            peak = max(peak, watched.memory_info().rss)
        except psutil.Error:
            break
        time.sleep(0.005)
    return peak


def start_publisher(tmp_path: Path) -> tuple[subprocess.Popen[str], Path, dict[str, str]]:
    """A live process and the path of its publication, in a private XDG_RUNTIME_DIR."""
    runtime_dir = tmp_path / "runtime"
    (runtime_dir / "gpuanat").mkdir(mode=0o700, parents=True)
    runtime_dir.chmod(0o700)
    env = {**cli_env(None), "XDG_RUNTIME_DIR": str(runtime_dir)}
    process = subprocess.Popen([sys.executable, "-c", SLEEPER], env=env, text=True, stdout=subprocess.PIPE)
    assert process.stdout is not None
    pid = int(process.stdout.readline())
    return process, runtime_dir / "gpuanat" / f"{pid}.jsonl", env


def test_watch_json_goes_on_through_every_kind_of_malformed_line_in_bounded_memory(tmp_path):
    publisher, publication, env = start_publisher(tmp_path)
    try:
        malformed_lines = write_hostile_publication(publication)
        garbage_bytes = publication.stat().st_size
        watcher = subprocess.Popen(
            [sys.executable, "-m", "gpuanat", "watch", str(publisher.pid), "--json", "--duration", "3"],
            env=env,
            cwd=REPO,
            text=True,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        peak: list[int] = []
        measuring = threading.Thread(target=lambda: peak.append(peak_rss_while_running(watcher)))
        measuring.start()
        stdout, stderr = watcher.communicate(timeout=120)
        measuring.join()
    finally:
        publisher.kill()
        publisher.wait()
    assert watcher.returncode == 0, stderr
    assert "Traceback" not in stderr
    records = [json.loads(line) for line in stdout.splitlines()]
    # one record at t=0 and every 0.25 s until 3 s have passed: 13, give or take a slow read
    assert 10 <= len(records) <= 14
    assert all(record["pid"] == publisher.pid and not record["exited"] for record in records)
    assert [record["t"] for record in records] == sorted(record["t"] for record in records)
    last = records[-1]
    assert last["malformed_events"] == malformed_lines
    # the valid events between the garbage all came through
    assert last["published"] and last["publisher_pid"] == publisher.pid
    assert (last["step"], last["samples"], last["total_steps"], last["params"]) == (3, 12, 100, 1_000)
    assert last["bands"]["weights_bytes"] == 4_000 and last["bands"]["optimizer_state_bytes"] == 8_000
    assert last["bands"]["activations_bytes"] == 1_234 and last["bands_measured_at_step"] == 2
    assert last["samples_per_second"] == pytest.approx(8.0)
    # memory: the reader holds about one line cap (1 MiB) at a time, not the lines (5 and 100 MB here). The
    # watcher peaked at about 25 MB here (an unbounded reader: 457 MB on this file)
    assert MAX_EVENT_LINE_BYTES < 5 * MB
    (peak_rss_bytes,) = peak
    # The old reader held the whole 100 MB line (457 MB of RSS); a bounded one stays near an idle watcher (25 MB
    # here, 56 MB on the H100 box's Python 3.12).
    assert garbage_bytes > 100 * MB  # one line alone is 100 MB: a reader holding it would pass that mark
    assert 0 < peak_rss_bytes < 100 * MB


def test_watch_json_distrusts_a_publication_that_is_a_hard_link(tmp_path):
    publisher, publication, env = start_publisher(tmp_path)
    try:
        publication.write_bytes(b"".join(encode(event) for event in VALID))
        publication.chmod(0o600)
        os.link(publication, tmp_path / "second-name.jsonl")
        watcher = subprocess.run(
            [sys.executable, "-m", "gpuanat", "watch", str(publisher.pid), "--json", "--duration", "1"],
            env=env,
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=120,
        )
    finally:
        publisher.kill()
        publisher.wait()
    assert watcher.returncode == 0, watcher.stderr
    records = [json.loads(line) for line in watcher.stdout.splitlines()]
    assert records and not any(record["published"] for record in records)
    assert all(
        "not trusted" in record["publication_reason"] and "2 hard links" in record["publication_reason"]
        for record in records
    )
