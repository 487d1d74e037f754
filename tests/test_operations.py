"""The operations anatomy: a real CPU run profiled by the real worker (`--profile-ops`), the FLOP and byte formulas,
the aggregation into groups, and what the summary prints. The GPU kernel-name rules are checked on the kernels of
real H100 profiles in test_operations_h100.py."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO, cli_env, last_json, run_cli

from gpuanat.core.operations.anatomy import (
    memory_bound_share,
    operations_anatomy,
    shares_sum_error_percent,
    table_rows,
)
from gpuanat.core.operations.classify import GROUPS, group_of, kernel_function
from gpuanat.core.operations.counts import contraction_flops, estimated_flops, moved_bytes
from gpuanat.core.operations.report import summary_lines
from gpuanat.core.vocabulary.protocol import KernelRow, Operations

pytestmark = pytest.mark.xdist_group("test_operations")
"""Its tests share a module-scoped real run: pytest-xdist gives them all to one worker (`--dist loadgroup`)."""

TINY = ["--device", "cpu", "--preset", "tiny", "--seq-len", "64", "--samples", "96"]


@pytest.fixture(scope="module")
def profiled(tmp_path_factory):
    """A real `gpuanat run --profile-ops 2 --profile-ops-trace` of the tiny BERT on the CPU: its result (from the
    history), its trace, the history, and the summary it printed."""
    folder = tmp_path_factory.mktemp("profiled")
    trace = folder / "trace.json"
    completed = run_cli(
        ["run", *TINY, "--profile-ops", "2", "--profile-ops-trace", str(trace)], folder / "history.sqlite"
    )
    assert completed.returncode == 0, completed.stderr[-3000:]
    listed = run_cli(["history", "--json"], folder / "history.sqlite")
    (row,) = json.loads(listed.stdout)
    return row["result"], trace, folder / "history.sqlite", completed.stdout


def test_a_profiled_cpu_run_has_the_anatomy_of_its_operations(profiled):
    result, *_ = profiled
    anatomy = result["operations_anatomy"]
    assert anatomy["source"] == "torch.profiler" and anatomy["device"] == "cpu"
    assert anatomy["profiled_steps"] == 2
    assert shares_sum_error_percent(anatomy) < 1e-9  # every operator's own time lands in exactly one group
    assert anatomy["device_time_s"] == pytest.approx(sum(row["time_s"] for row in anatomy["kernels"]))
    # the tiny BERT's products are nearly all of its arithmetic, as in the paper
    assert anatomy["contractions"]["flop_share"] > 0.8
    assert anatomy["contractions"]["flop_share"] > 10 * anatomy["normalizations"]["flop_share"]
    groups_of = {}
    for row in anatomy["kernels"]:
        groups_of.setdefault(row["name"], set()).add(row["group"])
    assert groups_of["aten::mm"] == {"contractions"}
    assert groups_of["aten::native_layer_norm"] == {"normalizations"}
    assert groups_of["aten::gelu"] == {"elementwise"}
    assert "optimizer" in groups_of["aten::_fused_adamw_"]
    in_optimizer_step = [row for row in anatomy["kernels"] if row["optimizer"]]
    assert in_optimizer_step and all(row["group"] == "optimizer" for row in in_optimizer_step)


def test_the_profiler_s_own_step_marker_is_no_operation(profiled):
    """torch.profiler's range around each step (`ProfilerStep#N`, in the trace) owns, on a CPU, the time between the
    step's operators: it was the longest "other" kernel, half of the profile. It is no operation: not a row, not a
    top kernel, not in the time the shares are of (issue #48)."""
    result, trace, *_ = profiled
    anatomy = result["operations_anatomy"]
    assert "ProfilerStep#" in trace.read_text()  # the marker was in the profile
    markers = [row["name"] for row in anatomy["kernels"] if row["name"].startswith("ProfilerStep")]
    assert markers == []
    for group in GROUPS:
        assert not any(top["name"].startswith("ProfilerStep") for top in anatomy[group]["top_kernels"]), group


def test_profiled_steps_are_after_warm_up_and_out_of_the_steady_window(profiled):
    result, *_ = profiled
    anatomy = result["operations_anatomy"]
    last_profiled = anatomy["first_step"] + anatomy["profiled_steps"] - 1
    assert anatomy["first_step"] >= 3  # after warm-up and the profiler's own warm-up step
    assert result["warmup_steps"] >= last_profiled
    assert result["steady_samples_per_second"] is not None
    assert result["steps"] > last_profiled
    assert result["probe_time_by_part_s"]["profiling"] > 0  # set apart from the probe's cost
    assert anatomy["wall_s"] > 0 and anatomy["processing_s"] > 0


def test_the_trace_is_written_where_asked(profiled):
    result, trace, *_ = profiled
    assert result["operations_anatomy"]["trace_path"] == str(trace.resolve())
    events = json.loads(trace.read_text())["traceEvents"]
    names = {event.get("name") for event in events}
    assert "aten::mm" in names and "aten::native_layer_norm" in names


def test_the_history_keeps_the_anatomy(profiled):
    result, _, db, _ = profiled
    completed = run_cli(["history", "--json"], db)
    assert completed.returncode == 0, completed.stderr
    (row,) = [row for row in json.loads(completed.stdout) if row["id"] == result["run_id"]]
    assert row["result"]["operations_anatomy"]["contractions"] == result["operations_anatomy"]["contractions"]


def test_the_summary_prints_the_table_beside_the_paper(profiled):
    *_, stdout = profiled
    lines = stdout.splitlines()
    start = next(index for index, line in enumerate(lines) if line.startswith("Operations: 2 profiled steps"))
    table = lines[start + 1 : start + 8]
    assert "paper time" in table[0]
    assert table[1].split()[:2] == ["tensor", "contractions"] and "61.0%" in table[1] and "99.80%" in table[1]
    assert "25.5%" in table[2] and "13.5%" in table[3]
    assert "left out of the steady samples/s" in lines[start + 8]


@pytest.mark.parametrize(
    "args, words",
    [
        (["--profile-ops-trace", "/tmp/x.json"], "give --profile-ops too"),
        (["--profile-ops", "0"], "profile 1 to 50 steps"),
        (["--profile-ops", "lots"], "profile 1 to 50 steps"),
        (["--profile-ops", "--profile-ops-trace", "/no/such/folder/x.json"], "no such folder"),
    ],
)
def test_bad_profile_options_get_one_line_and_exit_2(tmp_path, args, words):
    completed = run_cli(["run", *TINY, *args], tmp_path / "history.sqlite", timeout_s=60)
    assert completed.returncode == 2
    assert words in completed.stderr and len(completed.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "history.sqlite").exists()  # nothing ran


def test_contraction_flops_follow_torchs_flop_counter():
    from torch.utils.flop_counter import sdpa_backward_flop_count, sdpa_flop_count

    assert contraction_flops("aten::mm", [[256, 64], [64, 128]]) == 2 * 256 * 64 * 128
    assert contraction_flops("aten::addmm", [[128], [256, 64], [64, 128], [], []]) == 2 * 256 * 64 * 128
    assert contraction_flops("aten::bmm", [[8, 512, 64], [8, 64, 512]]) == 2 * 8 * 512 * 64 * 512
    q = [4, 16, 512, 64]
    assert contraction_flops("aten::_scaled_dot_product_flash_attention", [q, q, q]) == sdpa_flop_count(q, q, q)
    assert contraction_flops(
        "aten::_scaled_dot_product_efficient_attention_backward", [q, q, q, q]
    ) == sdpa_backward_flop_count(q, q, q, q)
    kv = [4, 4, 512, 64]  # grouped-query attention: fewer key/value heads
    assert contraction_flops("aten::_scaled_dot_product_cudnn_attention", [q, kv, kv]) == sdpa_flop_count(q, kv, kv)
    assert contraction_flops("aten::gelu", [[4, 512]]) is None
    assert contraction_flops("aten::mm", [[256, 64], [32, 128]]) is None  # shapes that do not multiply


def test_memory_bound_operators_are_counted_from_their_elements_and_bytes():
    assert estimated_flops("normalizations", [[4, 512, 1024], [1024], [1024]]) == 5 * 4 * 512 * 1024
    assert estimated_flops("elementwise", [[4, 512, 1024], []]) == 4 * 512 * 1024
    assert estimated_flops("other", [[4, 512]]) is None
    assert estimated_flops("normalizations", [[4, 512, 1024]], "aten::sum") == 4 * 512 * 1024  # a reduction
    assert moved_bytes("aten::add", [[1024], [1024]], ["float", "float"]) == 3 * 4096
    assert moved_bytes("aten::mm", [[256, 64], [64, 128]], ["c10::BFloat16", "c10::BFloat16"]) == 2 * (
        256 * 64 + 64 * 128 + 256 * 128
    )
    assert moved_bytes("aten::add", [[1024]], []) is None  # a profiler that records no dtypes


def _row(name, group, time_s, flops=None, op=None):
    return KernelRow(name=name, op=op, optimizer=group == "optimizer", group=group, calls=1, time_s=time_s, flops=flops)


def test_groups_share_the_device_time_and_the_counted_flops():
    event = Operations(
        device="cuda",
        first_step=6,
        profiled_steps=3,
        wall_s=0.5,
        processing_s=1.0,
        kernels=[
            _row("gemm", "contractions", 0.6, 9.98e11),
            _row("softmax", "normalizations", 0.25, 1.7e9),
            _row("gelu", "elementwise", 0.1, 3e8),
            _row("adam", "optimizer", 0.04),
            _row("Memset (Device)", "memory_copies", 0.01),
            _row("weird", "not-a-group", 0.0),
        ],
    )
    anatomy = operations_anatomy(event)
    assert [anatomy[group]["time_share"] for group in GROUPS] == pytest.approx([0.6, 0.25, 0.1, 0.04, 0.01, 0.0])
    assert anatomy["contractions"]["flop_share"] == pytest.approx(9.98e11 / (9.98e11 + 1.7e9 + 3e8))
    assert anatomy["optimizer"]["flop_share"] is None  # its FLOPs are not counted: unknown, not 0
    assert anatomy["contractions"]["tflops_per_s"] == pytest.approx(9.98e11 / 0.6 / 1e12)
    assert anatomy["busy_share"] == pytest.approx(1.0 / 0.5)
    assert memory_bound_share(anatomy) == pytest.approx(0.35)
    assert [row["paper_time_share"] for row in table_rows(anatomy)[:3]] == [0.610, 0.255, 0.135]


def test_a_hostile_kernel_name_is_printed_escaped():
    event = Operations(
        device="cuda",
        first_step=6,
        profiled_steps=1,
        wall_s=0.1,
        processing_s=0.1,
        kernels=[_row("triton_poi_\x1b[31mred\x1b]0;title\x07", "elementwise", 0.1)],
        trace_path="/tmp/\x1b[2Jtrace",
    )
    text = "\n".join(summary_lines(operations_anatomy(event)))
    assert "\x1b" not in text and "\x07" not in text and "\\x1b[31mred" in text


@pytest.mark.parametrize(
    "name, op, group",
    [
        (
            "void at::native::reduce_kernel<128, 4, at::native::ReduceOp<float, [lambda(float) (instance 1)]>>(…)",
            "aten::sum",
            "normalizations",
        ),
        ("void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>>(int)", None, "elementwise"),
        (
            "void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>>(int)",
            "aten::embedding_dense_backward",
            "other",
        ),
        (
            "void at::native::unrolled_elementwise_kernel<at::native::direct_copy_kernel_cuda>(int)",
            "aten::_to_copy",
            "elementwise",
        ),
        ("triton_per_fused_add_native_layer_norm_3", None, "normalizations"),
        ("triton_poi_fused_gelu_1", None, "elementwise"),
        ("triton_tem_fused_mm_0", None, "contractions"),
        ("Memcpy HtoD (Pageable -> Device)", "aten::to", "memory_copies"),
    ],
)
def test_kernel_rules(name, op, group):
    assert group_of(name, op, optimizer=False, device="cuda") == group


def test_a_kernel_is_matched_by_its_function_name_not_its_template_arguments():
    assert (
        kernel_function("void at::native::(anonymous namespace)::softmax_warp_forward<float, 9>(float*)")
        == "at::native::softmax_warp_forward"
    )
    # a lambda in the arguments is no LAMB optimizer, an index type no indexing kernel
    name = "void at::native::elementwise_kernel<128, 2, [lambda(int) (instance 1)], IndexType>(int)"
    assert group_of(name, None, optimizer=False, device="cuda") == "elementwise"
    assert group_of(name, None, optimizer=True, device="cuda") == "optimizer"


def test_a_watched_loop_whose_probe_was_asked_to_profile_publishes_its_operations(tmp_path):
    """A plain PyTorch loop with `track` (tests/scripts/tiny_plain_loop.py), started outside gpuanat with
    GPUANAT_PROFILE_OPS=2, watched by PID: a record carries the anatomy once, the final record and the saved run
    carry it whole."""
    runtime_dir = tmp_path / "runtime"
    runtime_dir.mkdir(mode=0o700)
    env = {**cli_env(tmp_path / "history.sqlite", offline_hub=True), "XDG_RUNTIME_DIR": str(runtime_dir)}
    script = subprocess.Popen(
        [
            sys.executable,
            str(REPO / "tests" / "scripts" / "tiny_plain_loop.py"),
            "--probe",
            "--samples",
            "240",
            "--hold-s",
            "1",
        ],
        env={**env, "GPUANAT_PROFILE_OPS": "2"},
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        watcher = subprocess.run(
            [sys.executable, "-m", "gpuanat", "watch", str(script.pid), "--json"],
            env=env,
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=240,
        )
    finally:
        script.kill()
        script.wait()
    assert watcher.returncode == 0, watcher.stderr
    *records, final = [json.loads(line) for line in watcher.stdout.splitlines()]
    carrying = [record for record in records if record.get("operations_anatomy")]
    assert len(carrying) == 1  # said once, when it came
    anatomy = carrying[0]["operations_anatomy"]
    assert anatomy["profiled_steps"] == 2 and "kernels" not in anatomy
    assert final["operations_anatomy"]["contractions"] == anatomy["contractions"]
    assert final["operations_anatomy"]["kernels"]
    assert not any(row["name"].startswith("ProfilerStep") for row in final["operations_anatomy"]["kernels"])
    assert shares_sum_error_percent(final["operations_anatomy"]) < 1e-9


def test_a_profile_that_cannot_be_read_costs_the_run_its_operations_and_nothing_else(tmp_path):
    completed = run_cli(
        ["run", *TINY, "--profile-ops", "2", "--json"], tmp_path / "history.sqlite", fault="profile-read@0"
    )
    assert completed.returncode == 0, completed.stderr[-3000:]
    result = last_json(completed.stdout)
    assert result["status"] == "ok" and result["operations_anatomy"] is None
    assert result["bands"]["weights_bytes"] > 0 and result["steady_samples_per_second"] is not None
    log = Path(result["log_path"]).read_text()
    assert (
        "profiling the operations failed (training goes on, without them): RuntimeError: the profile cannot be "
        "read (injected by test)" in log
    )


def test_the_history_lists_a_profiled_runs_shares(profiled):
    result, _, db, _ = profiled
    completed = run_cli(["history", "--format", "csv"], db)
    assert completed.returncode == 0, completed.stderr
    header, *rows = completed.stdout.strip().splitlines()
    column = header.split(",").index("operations")
    anatomy = result["operations_anatomy"]
    expected = "/".join(
        f"{100 * anatomy[group]['time_share']:.0f}" for group in ("contractions", "normalizations", "elementwise")
    )
    assert any(row.split(",")[column] == expected for row in rows)
