"""A stop signal that comes while Python shuts down a headless command cannot change its exit status.

Python puts the handlers it installed back to the default early in its shutdown, so a second Ctrl-C or a
repeated SIGTERM that lands while a finished command's interpreter is finalising would end it by that signal
(seen under load: `test_a_stop_signal_stops_the_run_and_records_it_as_stopped[SIGINT-then-SIGTERM]` exited -15,
not 130). `StopSignals.ignore_from_now`, which `gpuanat.cli.main` calls as a command ends, ignores them instead.
Here a real process makes its shutdown slow on purpose (an object whose finaliser sleeps) and a signal is sent
into it; without `ignore_from_now` the same process dies of the signal, so the check can fail."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
import time

import pytest
from conftest import cli_env

COMMAND_THAT_ENDS = textwrap.dedent("""
    import sys, time
    from gpuanat.core.run.stop_signals import StopSignals

    class SlowToCollect:  # collected while Python finalises its modules, after its handlers went back to default
        def __del__(self):
            time.sleep(2)

    stop_signals = StopSignals().install()
    slow = SlowToCollect()
    if sys.argv[1] == "ignore":
        stop_signals.ignore_from_now()
    print("ended", flush=True)
    sys.exit(130)
""")


@pytest.mark.parametrize("stop_signal", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP], ids=lambda s: s.name)
@pytest.mark.parametrize("ending", ["ignore", "keep handlers"])
def test_a_stop_signal_during_the_shutdown_of_an_ended_command_leaves_its_exit_code(ending, stop_signal):
    process = subprocess.Popen(
        [sys.executable, "-c", COMMAND_THAT_ENDS, ending], stdout=subprocess.PIPE, text=True, env=cli_env(None)
    )
    try:
        assert process.stdout is not None and process.stdout.readline().strip() == "ended"
        time.sleep(0.5)  # in its finaliser's sleep now
        process.send_signal(stop_signal)
        returncode = process.wait(timeout=30)
    finally:
        if process.poll() is None:
            process.kill()
    assert returncode == (130 if ending == "ignore" else -stop_signal)


def test_the_cli_ignores_stop_signals_once_its_command_has_ended(tmp_path):
    """`gpuanat.cli.main` itself, for a real headless command: its handlers are in place while it runs and stop
    signals are ignored once it has returned."""
    probe = textwrap.dedent("""
        import signal, sys
        import gpuanat.cli
        from gpuanat.core.run import stop_signals

        seen = {}
        original = stop_signals.StopSignals.install
        def install(self):
            installed = original(self)
            seen["while it runs"] = signal.getsignal(signal.SIGTERM) == self._handle
            return installed
        stop_signals.StopSignals.install = install
        code = gpuanat.cli.main()
        ignored = all(signal.getsignal(s) is signal.SIG_IGN for s in stop_signals.STOP_SIGNALS)
        print(code, seen["while it runs"], ignored)
    """)
    completed = subprocess.run(
        [sys.executable, "-c", probe, "history", "--json"],
        capture_output=True,
        text=True,
        timeout=60,
        env=cli_env(tmp_path / "history.sqlite"),
    )
    assert completed.stdout.split()[-3:] == ["0", "True", "True"], completed.stderr[-2000:]
