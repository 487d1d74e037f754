"""The publication file that AnatomyCallback writes for `gpuanat watch`: where, who may read it, how big it gets.

Real files in a private temporary directory; the clock is injected so throttling is exact.
"""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import tracemalloc
from pathlib import Path

import pytest
from conftest import REPO, cli_env

from gpuanat.core.measure.publish import (
    MAX_EVENTS_PER_READ,
    READ_CHUNK_BYTES,
    PublicationReader,
    Publisher,
    PublishRefused,
    publication_dirs,
    publication_file_problem,
    remove_dead_publications,
)
from gpuanat.core.vocabulary.protocol import (
    MAX_EVENT_LINE_BYTES,
    Done,
    Hello,
    Malformed,
    ModelInfo,
    ProbeBands,
    Step,
    encode,
)

BANDS = ProbeBands(
    weights_bytes=8,
    gradients_bytes=8,
    optimizer_state_bytes=16,
    activations_bytes=4,
    activations_method="saved_tensors",
    batch_bytes=2,
    measured_at_step=1,
)


def step(number: int, bands: ProbeBands | None = None) -> Step:
    return Step(
        step=number, samples=4 * number, tokens=128 * number, step_time_s=0.01, elapsed_s=0.01 * number, bands=bands
    )


class FakeClock:
    def __init__(self) -> None:
        self.now_s = 0.0

    def __call__(self) -> float:
        return self.now_s


def mode(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def test_directory_comes_from_xdg_runtime_dir_else_tmp_per_uid():
    assert publication_dirs({"XDG_RUNTIME_DIR": "/run/user/1000"}, 1000) == [
        Path("/run/user/1000/gpuanat"),
        Path("/tmp/gpuanat-1000"),
    ]
    assert publication_dirs({}, 1000) == [Path("/tmp/gpuanat-1000")]
    assert publication_dirs({"XDG_RUNTIME_DIR": "relative"}, 7) == [Path("/tmp/gpuanat-7")]


def test_publisher_creates_a_private_directory_and_file(tmp_path):
    publisher = Publisher(tmp_path / "gpuanat")
    publisher.publish(Hello(pid=os.getpid(), versions={}, device="cpu", device_name=None, config={}))
    assert publisher.path == tmp_path / "gpuanat" / f"{os.getpid()}.jsonl"
    assert (mode(publisher.path.parent), mode(publisher.path)) == (0o700, 0o600)
    assert publication_file_problem(publisher.path, os.getuid()) is None
    publisher.close()
    assert not publisher.path.exists()


def test_publisher_refuses_a_directory_open_to_others_or_not_ours_or_a_symlink(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o755)
    shared.chmod(0o755)
    with pytest.raises(PublishRefused, match="open to other users"):
        Publisher(shared).open()
    assert not list(shared.iterdir())
    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    with pytest.raises(PublishRefused, match="not to us"):
        Publisher(private, uid=os.getuid() + 1).open()
    (tmp_path / "link").symlink_to(private)
    with pytest.raises(PublishRefused, match="not a directory"):
        Publisher(tmp_path / "link").open()


def test_plain_steps_are_throttled_and_measured_steps_model_and_done_always_kept(tmp_path):
    clock = FakeClock()
    publisher = Publisher(tmp_path / "g", clock=clock, plain_step_interval_s=0.25)
    reader = PublicationReader(publisher.path)
    publisher.publish(ModelInfo(params=10, trainable_params=10, weights_bytes=40, dtype="float32", total_steps=100))
    written = []
    for number in range(1, 101):
        clock.now_s = number / 16  # 16 steps per second, exact in binary
        written.append(publisher.publish(step(number, BANDS if number in (1, 2, 3, 50) else None)))
    publisher.publish(
        Done(
            status="ok",
            steps=100,
            samples=400,
            train_runtime_s=1.0,
            samples_per_second=400.0,
            steady_samples_per_second=410.0,
            warmup_steps=10,
        )
    )
    events = reader.read()
    steps = [event.step for event in events if isinstance(event, Step)]
    # every measured step, and plain steps at most every 0.25 s (4 steps) after the last step written
    assert steps == [1, 2, 3, *range(7, 50, 4), 50, *range(54, 101, 4)]
    assert [number for number, kept in enumerate(written, start=1) if kept] == steps
    assert publisher.skipped_steps == 100 - len(steps)
    assert (events[0].type, events[-1].type) == ("model", "done")
    publisher.close()


def test_a_full_file_starts_over_from_its_header_and_the_reader_follows(tmp_path):
    publisher = Publisher(tmp_path / "g", plain_step_interval_s=0.0, max_file_bytes=2000)
    reader = PublicationReader(publisher.path)
    publisher.publish(Hello(pid=1, versions={}, device="cpu", device_name=None, config={}))
    publisher.publish(ModelInfo(params=10, trainable_params=10, weights_bytes=40, dtype="float32", total_steps=0))
    publisher.publish(step(1, BANDS))
    seen: list = reader.read()
    for number in range(2, 60):
        publisher.publish(step(number))
        seen.extend(reader.read())
        assert publisher.path.stat().st_size <= 2000
    assert publisher.rewrites >= 2
    assert mode(publisher.path) == 0o600
    last = [event.step for event in seen if isinstance(event, Step)][-1]
    assert last == 59
    with publisher.path.open() as rewritten:
        first_types = [line.split('"type":"')[1].split('"')[0] for line in rewritten.readlines()[:3]]
    assert first_types == ["hello", "model", "step"]
    publisher.close()


def test_reader_distrusts_files_others_can_read_and_files_older_than_the_process(tmp_path):
    directory = tmp_path / "g"
    directory.mkdir(mode=0o700)
    loose = directory / "1.jsonl"
    loose.write_text("")
    loose.chmod(0o644)
    reader = PublicationReader(loose)
    assert reader.read() == [] and "open to other users" in reader.problem
    old = directory / "2.jsonl"
    old.write_text('{"v":1,"type":"model"}\n')
    old.chmod(0o600)
    os.utime(old, (1_000, 1_000))
    reader = PublicationReader(old, not_before_s=2_000)
    assert reader.read() == [] and "older than the process" in reader.problem


def test_reader_returns_only_complete_lines(tmp_path):
    directory = tmp_path / "g"
    directory.mkdir(mode=0o700)
    path = directory / "3.jsonl"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
    reader = PublicationReader(path)
    encoded = encode(step(1))
    os.write(fd, encoded[:10])
    assert reader.read() == []
    os.write(fd, encoded[10:] + encode(step(2)))
    assert [event.step for event in reader.read()] == [1, 2]
    os.close(fd)


def test_files_of_dead_processes_are_removed(tmp_path):
    directory = tmp_path / "g"
    directory.mkdir(mode=0o700)
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True, check=True
    )
    dead_file = directory / f"{dead.stdout.strip()}.jsonl"
    live_file = directory / f"{os.getpid()}.jsonl"
    for path in (dead_file, live_file):
        path.write_text("")
    assert remove_dead_publications(directory) == [dead_file]
    assert live_file.exists()


def test_a_script_whose_publication_directory_is_unsafe_trains_on_with_one_warning(tmp_path):
    """A real training script with the callback, publishing refused: training completes, one warning."""
    runtime_dir = tmp_path / "runtime"
    runtime_dir.mkdir()
    (runtime_dir / "gpuanat").mkdir(mode=0o777)
    (runtime_dir / "gpuanat").chmod(0o777)
    env = {**cli_env(None, offline_hub=True), "XDG_RUNTIME_DIR": str(runtime_dir)}
    completed = subprocess.run(
        [sys.executable, str(REPO / "tests" / "scripts" / "tiny_trainer.py"), "--callback", "--samples", "32"],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert completed.returncode == 0, completed.stderr[-2000:]
    warnings = [line for line in completed.stderr.splitlines() if line.startswith("gpuanat:")]
    assert len(warnings) == 1
    assert "publishing for `gpuanat watch` turned off" in warnings[0] and "open to other users" in warnings[0]
    assert "train_runtime" in completed.stdout
    assert list((runtime_dir / "gpuanat").iterdir()) == []


# --- hostile files: the writer never touches what it did not create --------------------------------------


def private_dir(tmp_path: Path) -> Path:
    directory = tmp_path / "g"
    directory.mkdir(mode=0o700)
    return directory


def test_the_rewrite_refuses_a_temporary_that_is_a_hard_link_and_leaves_it(tmp_path):
    directory = private_dir(tmp_path)
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    publisher = Publisher(directory, plain_step_interval_s=0.0, max_file_bytes=600)
    publisher.publish(ModelInfo(params=10, trainable_params=10, weights_bytes=40, dtype="float32", total_steps=0))
    os.link(victim, directory / f"{publisher.pid}.jsonl.new")
    with pytest.raises(PublishRefused, match="hard links"):
        for number in range(1, 20):
            publisher.publish(step(number))
    assert victim.read_text() == "precious\n" and os.stat(victim).st_nlink == 2
    publisher.close()
    assert not publisher.path.exists() and (directory / f"{publisher.pid}.jsonl.new").exists()


def test_a_stale_temporary_of_this_publisher_is_replaced_and_the_rewrite_goes_on(tmp_path):
    """A `.new` left by an earlier process with this PID (last written before this process started)."""
    directory = private_dir(tmp_path)
    publisher = Publisher(directory, plain_step_interval_s=0.0, max_file_bytes=600)
    publisher.publish(ModelInfo(params=10, trainable_params=10, weights_bytes=40, dtype="float32", total_steps=0))
    stale = directory / f"{publisher.pid}.jsonl.new"
    stale.write_text("left over\n")
    os.utime(stale, (1_000, 1_000))
    for number in range(1, 20):
        publisher.publish(step(number))
    assert publisher.rewrites >= 1 and not stale.exists()
    assert "left over" not in publisher.path.read_text()
    publisher.close()
    assert list(directory.iterdir()) == []


def test_the_rewrite_does_not_replace_a_file_put_in_place_of_the_publication(tmp_path):
    directory = private_dir(tmp_path)
    publisher = Publisher(directory, plain_step_interval_s=0.0, max_file_bytes=600)
    publisher.publish(ModelInfo(params=10, trainable_params=10, weights_bytes=40, dtype="float32", total_steps=0))
    replacement = directory / "replacement"
    replacement.write_text("someone else's\n")
    os.replace(replacement, publisher.path)
    with pytest.raises(PublishRefused, match="did not create"):
        for number in range(1, 20):
            publisher.publish(step(number))
    publisher.close()
    assert publisher.path.read_text() == "someone else's\n"
    assert list(directory.iterdir()) == [publisher.path]  # its temporary was removed, nothing else


def test_a_publisher_reopened_after_close_without_removal_replaces_its_own_file(tmp_path):
    directory = private_dir(tmp_path)
    publisher = Publisher(directory)
    publisher.publish(ModelInfo(params=10, trainable_params=10, weights_bytes=40, dtype="float32", total_steps=0))
    publisher.close(remove=False)
    publisher.publish(ModelInfo(params=20, trainable_params=20, weights_bytes=80, dtype="float32", total_steps=0))
    assert [event.params for event in PublicationReader(publisher.path).read()] == [20]
    publisher.close()
    assert not publisher.path.exists()


def test_reader_distrusts_a_file_with_another_name(tmp_path):
    directory = private_dir(tmp_path)
    path = directory / "4.jsonl"
    path.write_bytes(encode(step(1)))
    path.chmod(0o600)
    assert [event.step for event in PublicationReader(path).read()] == [1]
    os.link(path, tmp_path / "other-name")
    reader = PublicationReader(path)
    assert reader.read() == [] and "2 hard links" in reader.problem


def test_dead_processes_files_that_are_not_plainly_ours_are_left(tmp_path):
    directory = private_dir(tmp_path)
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    pids = [
        int(
            subprocess.run(
                [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True, check=True
            ).stdout
        )
        for _ in range(4)
    ]
    plain, temporary = directory / f"{pids[0]}.jsonl", directory / f"{pids[1]}.jsonl.new"
    linked, symlinked = directory / f"{pids[2]}.jsonl", directory / f"{pids[3]}.jsonl"
    plain.write_text("")
    temporary.write_text("")
    os.link(victim, linked)
    symlinked.symlink_to(victim)
    assert sorted(remove_dead_publications(directory)) == sorted([plain, temporary])
    assert linked.exists() and symlinked.is_symlink() and victim.read_text() == "precious\n"


# --- a bounded reader ---------------------------------------------------------------------------------


def append(path: Path, data: bytes) -> None:
    with path.open("ab") as out:
        out.write(data)


def test_an_over_long_line_is_one_malformed_and_costs_about_the_cap(tmp_path):
    directory = private_dir(tmp_path)
    path = directory / "5.jsonl"
    path.write_bytes(encode(step(1)) + b'{"v":1,"junk":"' + b"x" * (5 << 20) + b'"}\n' + encode(step(2)))
    path.chmod(0o600)
    reader = PublicationReader(path)
    tracemalloc.start()
    events = reader.read()
    _, peak_bytes = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert [getattr(event, "step", None) for event in events] == [1, None, 2]
    malformed = events[1]
    assert isinstance(malformed, Malformed)
    assert malformed.reason == f"line longer than {MAX_EVENT_LINE_BYTES} bytes"
    assert malformed.line.startswith('{"v":1,"junk":"xxx') and len(malformed.line) <= 200
    # the line is 5 MiB; what the reader held at most is the cap and a chunk, plus Python's small change
    assert peak_bytes < MAX_EVENT_LINE_BYTES + 2 * READ_CHUNK_BYTES + (256 << 10)


def test_an_unterminated_tail_past_the_cap_is_reported_once_and_the_reader_resynchronises(tmp_path):
    directory = private_dir(tmp_path)
    path = directory / "6.jsonl"
    path.write_bytes(encode(step(1)) + b"y" * (MAX_EVENT_LINE_BYTES // 2))
    path.chmod(0o600)
    reader = PublicationReader(path)
    assert [event.step for event in reader.read()] == [1]
    append(path, b"y" * MAX_EVENT_LINE_BYTES)  # past the cap, still no newline
    (malformed,) = reader.read()
    assert isinstance(malformed, Malformed) and malformed.line == "y" * 200
    append(path, b"y" * (3 * MAX_EVENT_LINE_BYTES))
    assert reader.read() == []  # the rest of that line is dropped as it comes
    append(path, b"y\n" + encode(step(2)))
    assert [event.step for event in reader.read()] == [2]


def test_one_read_takes_a_bounded_number_of_events(tmp_path):
    directory = private_dir(tmp_path)
    path = directory / "7.jsonl"
    path.write_bytes(b"x\n" * 100_000 + encode(step(3)))
    path.chmod(0o600)
    reader = PublicationReader(path)
    counts = []
    events: list = []
    while batch := reader.read():
        counts.append(len(batch))
        events.extend(batch)
    assert max(counts) <= MAX_EVENTS_PER_READ + READ_CHUNK_BYTES // 2
    assert len(counts) > 1
    assert sum(isinstance(event, Malformed) for event in events) == 100_000
    assert events[-1].step == 3
