"""The `gpuanat run --json` results of real tiny CPU runs as gpuanat printed them before the result was typed
(tests/data/result_golden.json), and the normalisation that makes two runs of one configuration comparable: what
changes between runs (times and rates, run ids, PIDs, paths, the log's tail, which timing findings the diagnosis
makes) is replaced by a placeholder; every key, its place and every other value stays as printed.

`python tests/result_golden.py` recorded the file (at commit 29594be); the tests that run these configurations
compare their fresh results with it (`assert_as_recorded`). Its "interrupted" and "predictions" entries are what
`interrupted.result_from_steps`/`interrupted_result` and `predict.prediction_json` returned at that commit for the
inputs beside them (test_result_contract). Changed since by intent (issue #50): the prediction stored with
"compiled_bs8" (the whole model compiled is not predicted: its peaks are null, with the reason as the caveat), and a
one-GPU decoder's predicted peak reserved and device memory in "predictions" (the replayed allocation stream).
"""

from __future__ import annotations

import json
import signal
import sys
from pathlib import Path
from typing import Any

from gpuanat.core.measure.activity import ACTIVITY_FIELDS, THROTTLE_FIELDS
from gpuanat.core.measure.data_rates import DATA_FIELDS
from gpuanat.core.measure.loss_curve import LOSS_FIELDS
from gpuanat.core.vocabulary.config import RunConfig

GOLDEN_PATH = Path(__file__).resolve().parent / "data" / "result_golden.json"
_VOLATILE = {"run_id": "<run id>", "pid": "<pid>", "log_path": "<path>"}
FINDING_KEYS = ["bottleneck", "evidence", "fix"]
KEYS_ADDED_SINCE = (
    *("modules", "out_of_memory"),
    *("sm_active_percent", "sm_occupancy_percent", "tensor_active_percent", "dram_bandwidth_percent"),
    *("average_power_w", "energy_joules", "joules_per_sample", "joules_per_token"),
    *("sm_clock_mhz", "max_sm_clock_mhz", "throttled_percent", "throttle_reasons"),
    *LOSS_FIELDS,
    *("padding_percent", "real_tokens_per_second", "steady_real_tokens_per_second", "length_histogram"),
)
"""Keys a result has gained since the file was recorded (issue #49: memory by module, the failing allocation; issue
#51: the GPU's activity, energy and clocks; issue #52: the loss, what the batches of --data held), before the
session's own; every key recorded keeps its place and its value, and a new one that is None says why in
`unavailable`."""
CONFIG_KEYS_ADDED_SINCE = ("data", "text_field", "tokenizer", "padding", "autocast", "selective_checkpointing")
"""RunConfig fields added since (issue #52: --data and --padding; #54: --no-autocast, --selective-checkpointing),
left out of a fresh config where at their defaults: the recorded configurations trained the random data, under
autocast where mixed, without selective checkpointing."""


HOW_FAR_IT_TRAINED = {
    *("steps", "samples", "steady_samples_per_second", "steady_tokens_per_second", "achieved_tflops", "mfu"),
    "step_time_breakdown",
}
"""Of a stopped run, what depends on when the signal came: how far it trained, and whether that was past its warm-up
(then it has a steady rate, its FLOP/s and its steps' phases; before, each is missing with a reason)."""


def normalised(value: Any, key: str | None = None, stopped: bool = False) -> Any:
    """`value` with what differs between two runs of one configuration replaced by placeholders, keys in place; of a
    stopped run also how far it trained (when the signal came: `HOW_FAR_IT_TRAINED`, and their reasons)."""
    if key is None and isinstance(value, dict) and value.get("status") == "stopped":
        stopped = True
    if stopped and key in HOW_FAR_IT_TRAINED:
        return "<how far it trained>"
    if stopped and key == "unavailable" and isinstance(value, dict):
        value = {name: reason for name, reason in value.items() if name not in HOW_FAR_IT_TRAINED}
    if key in _VOLATILE and value is not None:
        return _VOLATILE[key]
    if key == "diagnosis" and isinstance(value, list):
        # which findings are made (if any) depends on the measured step times: only that each has its three parts
        # (the file recorded each finding as its keys' JSON)
        return [
            finding
            for finding in value
            if not (isinstance(finding, dict) and list(finding) == FINDING_KEYS) and finding != json.dumps(FINDING_KEYS)
        ]
    if key == "message" and isinstance(value, str):
        return value.split("\n", 1)[0]  # a failed run's message quotes its log's last lines (tqdm, timings)
    if isinstance(value, dict):
        return {name: normalised(item, name, stopped) for name, item in value.items()}
    if isinstance(value, list):
        return [normalised(item, None, stopped) for item in value]
    if isinstance(value, float):
        return "<float>"
    return value


def assert_as_recorded(name: str, result: dict[str, Any]) -> None:
    """`result` (a fresh `gpuanat run --json` output) prints as the recorded one of configuration `name` did."""
    golden = normalised(json.loads(GOLDEN_PATH.read_text())[name])  # (placeholders stay as they are)
    fresh = normalised(result)
    if isinstance(fresh.get("config"), dict):
        defaults = RunConfig().to_json()
        fresh["config"] = {
            key: value
            for key, value in fresh["config"].items()
            if key not in CONFIG_KEYS_ADDED_SINCE or value != defaults[key]
        }
    added = [key for key in fresh if key not in golden]
    assert added == [key for key in KEYS_ADDED_SINCE if key in fresh], (name, added)  # the new ones, and only them
    # (a run's modules and failure are None, not unread)
    readings = [key for key in added if key in (*ACTIVITY_FIELDS, *THROTTLE_FIELDS, *LOSS_FIELDS, *DATA_FIELDS)]
    missing = [key for key in readings if fresh[key] is None and key not in (fresh.get("unavailable") or {})]
    assert not missing, (name, "a new value None without its reason in unavailable", missing)
    fresh = {key: value for key, value in fresh.items() if key not in added}  # every other key in its place
    if isinstance(fresh.get("unavailable"), dict):  # the new values' reasons go with them
        fresh["unavailable"] = {key: why for key, why in fresh["unavailable"].items() if key not in added}
    assert json.dumps(fresh) == json.dumps(golden), (name, _differences(fresh, golden))


def _differences(fresh: Any, recorded: Any, where: str = "") -> list[str]:
    """Where two normalised results differ: keys (in order) or values."""
    if isinstance(fresh, dict) and isinstance(recorded, dict):
        if list(fresh) != list(recorded):
            return [f"{where or '/'}: keys {list(fresh)} != {list(recorded)}"]
        return [line for key in fresh for line in _differences(fresh[key], recorded[key], f"{where}/{key}")]
    if isinstance(fresh, list) and isinstance(recorded, list) and len(fresh) == len(recorded):
        return [
            line
            for index, pair in enumerate(zip(fresh, recorded, strict=True))
            for line in _differences(*pair, f"{where}[{index}]")
        ]
    return [] if json.dumps(fresh) == json.dumps(recorded) else [f"{where}: {fresh!r} != {recorded!r}"]


def _record() -> None:
    """Runs every configuration the tests compare and writes their normalised results to GOLDEN_PATH."""
    import tempfile

    import psutil

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from conftest import TINY_CPU, last_json, start_cli, wait_for_steps
    from test_distributed_cpu import TWO_RANKS
    from test_failures import FAULTS, STOPPED_RUN
    from test_run_cpu import ALLOCATOR_CONF, RUNS

    directory = Path(tempfile.mkdtemp())
    recorded: dict[str, Any] = {}
    started = {
        **{
            name: start_cli(["run", *args, "--json"], directory / "a.sqlite", extra_env=ALLOCATOR_CONF)
            for name, args in RUNS.items()
        },
        **{
            name: start_cli(["run", *TINY_CPU, "--json"], directory / "b.sqlite", fault=fault)
            for name, fault in FAULTS.items()
        },
        "ddp_two_ranks": start_cli(["run", *TWO_RANKS, "--json"], directory / "c.sqlite"),
    }
    for name, process in started.items():
        stdout, _stderr = process.communicate(timeout=900)
        recorded[name] = normalised(last_json(stdout))
        print(name, process.returncode, recorded[name]["status"], file=sys.stderr)
    stopped = start_cli(STOPPED_RUN, directory / "d.sqlite")
    wait_for_steps(directory / "d.sqlite", 2, psutil.Process(stopped.pid))
    stopped.send_signal(signal.SIGINT)
    stdout, _ = stopped.communicate(timeout=60)
    recorded["stopped"] = normalised(last_json(stdout))
    GOLDEN_PATH.write_text(json.dumps(recorded, indent=1) + "\n")


if __name__ == "__main__":
    _record()
