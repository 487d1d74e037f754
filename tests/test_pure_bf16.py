"""Pure bf16 (`--weights-dtype bf16 --no-autocast`): a real run on the CPU with autocast off (its logits stay
bf16, where autocast's are fp32), its refusals, the dashboard's `W` through the three modes, and the prediction
against bert-large measured on the H100 (tests/data/tune54/pure_bf16_h100.json)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import last_json, run_cli, state_bytes
from test_keys_page import cpu_app, panel_text, until_probed

from gpuanat.cli.common import config_from_args
from gpuanat.cli.parser import build_parser
from gpuanat.core.memory.allocation_templates import largest_batch
from gpuanat.core.memory.predict import estimate_memory
from gpuanat.core.vocabulary.config import RunConfig
from gpuanat.core.vocabulary.errors import ConfigError
from gpuanat.core.vocabulary.techniques import changed_config, weights_mode
from gpuanat.core.vocabulary.validation import validate_values
from gpuanat.worker.train import training_arguments_kwargs

LLAMA_TINY = ["--preset", "llama-tiny", "--device", "cpu", "--seq-len", "32", "--samples", "32", "--batch-size", "4"]
H100 = json.loads((Path(__file__).parent / "data" / "tune54" / "pure_bf16_h100.json").read_text())
PURE = RunConfig(precision="bf16", weights_dtype="bf16", autocast=False)


def test_a_pure_bf16_decoder_trains_without_autocast_its_bands_as_predicted(db_path):
    """Autocast off shows in the real run: the logits the model returns stay bf16 (accelerate converts a
    mixed-precision model's outputs to fp32), 2 bytes an element, as predicted; the state bands are exact."""
    completed = run_cli(
        ["run", *LLAMA_TINY, "--weights-dtype", "bf16", "--precision", "bf16", "--no-autocast", "--json"], db_path
    )
    assert completed.returncode == 0, completed.stderr[-3000:]
    result = last_json(completed.stdout)
    assert result["status"] == "ok" and result["steps"] == 8 and result["config"]["autocast"] is False
    config = RunConfig.from_json(result["config"])
    predicted = estimate_memory(config)
    for band in ("weights_bytes", "gradients_bytes", "optimizer_state_bytes"):
        assert state_bytes(result)[band] == getattr(predicted, band), band
    assert result["logits_bytes"] == predicted.logits_bytes == 4 * 32 * 32_000 * 2
    assert config.techniques_summary() == "bs4 bf16 pure-bf16"


def test_trainer_and_accelerate_run_without_autocast():
    assert training_arguments_kwargs(PURE, "/tmp/unused")["bf16"] is False
    assert training_arguments_kwargs(PURE.replace(autocast=True), "/tmp/unused")["bf16"] is True


@pytest.mark.parametrize(
    ("changes", "words"),
    [
        ({"autocast": False}, "give --weights-dtype bf16 too"),
        ({"autocast": False, "precision": "bf16"}, "give --weights-dtype bf16 too"),
        (
            {"autocast": False, "precision": "bf16", "weights_dtype": "bf16", "gpus": "2", "distributed": "fsdp"},
            "without autocast already",
        ),
    ],
)
def test_no_autocast_needs_a_bf16_model_and_no_sharding(changes, words):
    with pytest.raises(ConfigError, match="--no-autocast") as raised:
        validate_values(RunConfig(**changes))
    assert words in str(raised.value)


def test_the_command_line_refuses_no_autocast_alone_before_torch(db_path):
    completed = run_cli(["run", *LLAMA_TINY, "--no-autocast"], db_path)
    assert completed.returncode == 2
    assert "--no-autocast" in completed.stderr and "--weights-dtype bf16" in completed.stderr


def test_w_steps_fp32_bf16_pure_bf16_and_back():
    modes = [weights_mode(config := RunConfig())]
    for _ in range(3):
        config = changed_config(config, "weights_dtype")
        modes.append(weights_mode(config))
    assert modes == ["fp32", "bf16", "pure-bf16", "fp32"]
    assert config.autocast and config.precision == "bf16"
    sharded = RunConfig(gpus="2", distributed="fsdp", precision="bf16", weights_dtype="bf16")
    assert weights_mode(changed_config(sharded, "weights_dtype")) == "fp32"  # FSDP2 computes without autocast already


@pytest.mark.asyncio
async def test_the_panel_shows_pure_bf16(tmp_path):
    app = cpu_app(tmp_path, RunConfig(device="cpu", preset="llama-tiny"))
    async with app.run_test(size=(120, 40)) as pilot:
        await until_probed(app, pilot)
        await pilot.press("W", "W")
        await pilot.pause()
        assert not app.dashboard.config.autocast
        assert "W weights       pure-bf16" in panel_text(app)


@pytest.mark.parametrize("run", H100["runs"], ids=lambda run: run["name"])
def test_pure_bf16_bert_large_is_predicted_within_3_percent_of_the_h100(run):
    """Peak allocated memory of `gpuanat run` on the H100 against today's prediction of the same flags (compiled
    regions are predicted as eager)."""
    config = config_from_args(build_parser().parse_args(["run", *run["flags"].split()]), cuda_available=True)
    assert not config.autocast and run["gpu"] == "NVIDIA H100 80GB HBM3"
    predicted = estimate_memory(config).peak_allocated_bytes
    assert predicted == pytest.approx(run["peak_allocated_bytes"], rel=0.03)


def test_no_template_recorded_over_fp32_weights_stands_for_pure_bf16():
    """The allocator replay's templates were recorded with fp32 weights under autocast: a bf16 model, pure or not,
    is predicted by the bytes model (which the H100 runs above bear out), not replayed as if its weights were fp32."""
    usable = 78 * 2**30
    assert largest_batch(RunConfig(precision="bf16"), usable).method == "replay"
    for config in (RunConfig(precision="bf16", weights_dtype="bf16"), PURE):
        largest = largest_batch(config, usable)
        assert largest.method == "model" and largest.batch_size == largest.model_batch_size
    assert largest_batch(PURE, usable).batch_size > largest_batch(RunConfig(precision="bf16"), usable).batch_size
