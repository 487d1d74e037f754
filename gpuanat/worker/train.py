"""The training child: builds the model (`model`), the data and HF Trainer from a RunConfig, trains, reports events.

Run as `python -m gpuanat.worker --events-fd FD --config JSON`. Events go to FD; stdout and stderr
stay the human log. Exit codes: 0 done, 1 exception, 2 config error, 3 out of memory (the GPU's, or on a CPU run the
host's), 130 stopped.

As a rank of a distributed run (started by torchrun through gpuanat.worker.launch) it is given
`--rank-socket PATH` instead: it connects there, says which rank it is, sends its events on the connection and
holds it as its lifeline. Each rank trains on the GPU of its local rank.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import platform
import signal
import sys
import tempfile
import traceback
from typing import Any

from gpuanat.worker.batches import DataBatches, counting_trainer, data_batches
from gpuanat.worker.model import (
    build_model,
    compile_regions,
    compile_stats,
    enable_checkpointing,
    is_causal_lm,
    training_device,
)
from gpuanat.worker.out_of_memory import is_out_of_memory, out_of_memory_message

EXIT_OK, EXIT_EXCEPTION, EXIT_CONFIG, EXIT_OOM, EXIT_STOPPED = 0, 1, 2, 3, 130
LOGGING_STEPS = 10
"""Trainer logs (and so syncs for) the loss every this many steps."""
TOKEN_ID_LOW, TOKEN_ID_HIGH = 100, 30000
"""The docs' dummy data: random token ids in [100, 30000)."""


def _raise_keyboard_interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


def transformer_layer_class_names(model: Any) -> list[str]:
    """The model's repeated block class, which FSDP wraps one unit each: the class of the first ModuleList's items
    (BertLayer, GPT2Block, LlamaDecoderLayer). Not `_no_split_modules`, which may name the embeddings too: accelerate
    shards the input embeddings itself, and a module sharded twice fails."""
    import torch

    for module in model.modules():
        if isinstance(module, torch.nn.ModuleList) and len(module) > 0:
            return [type(module[0]).__name__]
    raise ValueError(f"cannot find the repeated layers of {type(model).__name__} for FSDP to wrap")


def deepspeed_config(stage: int) -> dict[str, Any]:
    """A DeepSpeed config that needs no compiled ops: ZeRO `stage`, the Trainer's own (torch) optimizer, no
    offload; batch, accumulation, precision and clipping from the TrainingArguments ("auto")."""
    return {
        "zero_optimization": {"stage": stage, "overlap_comm": True, "contiguous_gradients": True},
        "bf16": {"enabled": "auto"},
        "fp16": {"enabled": "auto"},
        "train_micro_batch_size_per_gpu": "auto",
        "train_batch_size": "auto",
        "gradient_accumulation_steps": "auto",
        "gradient_clipping": "auto",
        "zero_allow_untested_optimizer": True,
        "steps_per_print": 1_000_000_000,
        "wall_clock_breakdown": False,
    }


def distributed_arguments(config: Any, model: Any) -> dict[str, Any]:
    """TrainingArguments for `config.distributed`: DDP needs none (torchrun's environment turns it on); FSDP2 wraps
    each transformer layer; ZeRO passes a DeepSpeed config."""
    from gpuanat.core.vocabulary.techniques import ZERO_STAGES

    if config.distributed == "fsdp":
        layers = transformer_layer_class_names(model)
        # fsdp=True with everything in fsdp_config: the string form ("full_shard") is deprecated in transformers 5
        return {
            "fsdp": True,
            "fsdp_config": {"version": 2, "reshard_after_forward": True, "transformer_layer_cls_to_wrap": layers},
        }
    if config.distributed in ZERO_STAGES:
        return {"deepspeed": deepspeed_config(ZERO_STAGES[config.distributed])}
    return {}


def build_dataset(config: Any, vocab_size: int, causal_lm: bool = False) -> Any:
    """The docs' dummy dataset: random token ids, labels drawn as in the docs (a causal LM's labels: its input ids,
    which the model shifts), torch format."""
    import numpy as np
    from datasets import Dataset

    rng = np.random.default_rng(config.seed)
    high = min(TOKEN_ID_HIGH, vocab_size)
    input_ids = rng.integers(min(TOKEN_ID_LOW, high - 1), high, (config.samples, config.seq_len))
    dataset = Dataset.from_dict(
        {
            "input_ids": input_ids,
            "labels": input_ids.copy() if causal_lm else rng.integers(0, 1, config.samples),
        }
    )
    dataset.set_format("pt")
    return dataset


def data_counts(batches: DataBatches | None) -> dict[str, Any]:
    """The Done event's fields of a --data run: the tokens it trained, real and all, and its rows' lengths."""
    if batches is None:
        return {}
    trained, real, samples = batches.count.totals()
    return {
        "trained_tokens": trained,
        "real_tokens": real,
        "batch_samples": samples,
        "length_histogram": batches.length_histogram,
    }


def training_arguments_kwargs(config: Any, output_dir: str) -> dict[str, Any]:
    """TrainingArguments for `config` — shared with the plain-Trainer baseline benchmark."""
    import dataclasses

    from transformers import TrainingArguments

    # transformers 5.2x renamed gradient_checkpointing (deprecated) to activation_checkpointing.
    fields = {field.name for field in dataclasses.fields(TrainingArguments)}
    checkpointing_key = "activation_checkpointing" if "activation_checkpointing" in fields else "gradient_checkpointing"
    return {
        "output_dir": output_dir,
        "per_device_train_batch_size": config.batch_size,
        "gradient_accumulation_steps": config.grad_accum,
        # selective checkpointing is enabled on the model (`enable_checkpointing`): its policy is no argument's value
        checkpointing_key: config.grad_checkpointing and not config.selective_checkpointing,
        # pure bf16 (--no-autocast): the bf16 model computes without Trainer's autocast
        "fp16": config.precision == "fp16" and config.autocast,
        "bf16": config.precision == "bf16" and config.autocast,
        "tf32": config.tf32 if config.device == "cuda" else None,
        "optim": config.optim,
        "dataloader_num_workers": config.workers,
        "dataloader_pin_memory": config.pin_memory,
        "torch_compile": config.compile,
        "num_train_epochs": config.epochs,
        "max_steps": config.max_steps if config.max_steps is not None else -1,
        "use_cpu": config.device == "cpu",
        "seed": config.seed,
        "report_to": "none",
        "save_strategy": "no",
        "eval_strategy": "no",
        "logging_strategy": "steps",
        "logging_steps": LOGGING_STEPS,
        "log_level": "error",
    }


def _versions() -> dict[str, str]:
    import datasets
    import torch
    import transformers

    versions = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "datasets": datasets.__version__,
    }
    if torch.version.cuda:
        versions["cuda"] = torch.version.cuda
    return versions


MEMORY_HISTORY_MAX_EVENTS = 1_000_000
"""Allocator events a memory snapshot keeps (the oldest are dropped beyond): 2-step runs of bert-large made
14,000-88,000 on the H100 (benchmarks/results/h100/allocator/allocation_trace.log)."""


def record_memory_history(path: str | None) -> Any:
    """Start torch's allocator history when `path` is set (CUDA only); the returned function writes the snapshot
    there: pytorch.org/memory_viz reads it, and `gpuanat.core.memory.allocator` replays it. Besides torch's own keys it
    holds `gpuanat`: the device memory free when it was written (`torch.cuda.mem_get_info`)."""
    import pickle

    import torch

    if not path or not torch.cuda.is_available():
        return lambda: None
    torch.cuda.memory._record_memory_history(context="alloc", stacks="python", max_entries=MEMORY_HISTORY_MAX_EVENTS)

    def dump() -> None:
        snapshot = torch.cuda.memory._snapshot()
        free_bytes, total_bytes = torch.cuda.mem_get_info()
        snapshot["gpuanat"] = {
            "device_free_bytes": free_bytes,
            "device_total_bytes": total_bytes,
            "reserved_bytes": torch.cuda.memory_reserved(),
        }
        with open(path, "wb") as file:
            pickle.dump(snapshot, file)

    return dump


def milestone_emitter(emit: Any) -> Any:
    """A function that reports a start-up or end milestone (protocol.MILESTONES) as reached now."""
    import time

    from gpuanat.core.vocabulary.protocol import Milestone

    return lambda name: emit(Milestone(name=name, monotonic_s=time.monotonic()))


def train(config: Any, emit: Any) -> int:
    import torch
    from transformers import Trainer, TrainingArguments

    from gpuanat.core.measure.gpus import rank_file_path
    from gpuanat.core.vocabulary.config import ALLOCATOR_CONF_VARIABLE, MEMORY_SNAPSHOT_VARIABLE
    from gpuanat.core.vocabulary.errors import ConfigError
    from gpuanat.core.vocabulary.protocol import Done, Error, Hello
    from gpuanat.worker.probe.hf import AnatomyCallback
    from gpuanat.worker.probe.oom_capture import CAPTURE

    reached = milestone_emitter(emit)
    reached("imported")
    if config.device == "cuda":
        torch.cuda.set_device(training_device(config))  # before anything touches CUDA: one context, on our GPU
    device_name = torch.cuda.get_device_name() if config.device == "cuda" else platform.processor() or None
    emit(
        Hello(
            pid=os.getpid(),
            versions=_versions(),
            device=config.device,
            device_name=device_name,
            config=config.to_json(),
            allocator_conf=os.environ.get(ALLOCATOR_CONF_VARIABLE),
        )
    )
    reached("cuda ready")
    dump_memory_snapshot = record_memory_history(rank_file_path(os.environ.get(MEMORY_SNAPSHOT_VARIABLE), os.environ))
    # An out-of-memory error from here on is described where it happens, the model's loading included
    CAPTURE.attach()
    probe = AnatomyCallback(emit)
    trainer = None
    batches: DataBatches | None = None
    with tempfile.TemporaryDirectory(prefix="gpuanat-") as output_dir:
        try:
            arguments = None
            if config.distributed == "zero3":  # HF's ZeRO-3 recipe: the arguments before the model, which
                # transformers then builds inside deepspeed.zero.Init, partitioned layer by layer (never whole on a GPU)
                arguments = TrainingArguments(
                    **training_arguments_kwargs(config, output_dir), **distributed_arguments(config, None)
                )
            try:
                model = build_model(config)
            except ConfigError as error:
                emit(Error(kind="config", flag=error.flag, message=error.message))
                return EXIT_CONFIG
            except (OSError, ValueError) as error:
                emit(Error(kind="config", flag="--model", message=f"cannot load model {config.model!r}: {error}"))
                return EXIT_CONFIG
            compiled_frames = 1 if config.compile else 0
            if config.compile_regions:  # one compiled frame a kind of module: its graph serves every layer
                compiled_frames = len({type(module) for module in compile_regions(model)})
            if config.grad_checkpointing and config.selective_checkpointing:
                enable_checkpointing(model, config)
            reached("model built")
            if config.data is not None:
                try:
                    batches = data_batches(config, model)
                except ConfigError as error:
                    emit(Error(kind="config", flag=error.flag, message=error.message))
                    return EXIT_CONFIG
                dataset = batches.dataset
            else:
                dataset = build_dataset(config, model.config.vocab_size, causal_lm=is_causal_lm(model.config))
            reached("dataset built")
            if arguments is None:
                arguments = TrainingArguments(
                    **training_arguments_kwargs(config, output_dir), **distributed_arguments(config, model)
                )
            if config.engine == "accelerate":
                from gpuanat.worker.accelerate_loop import train_with_accelerate

                metrics = train_with_accelerate(
                    config,
                    model,
                    dataset,
                    probe,
                    arguments,
                    LOGGING_STEPS,
                    on_ready=lambda: reached("trainer ready"),
                    collate_fn=batches.collator if batches else None,
                    count=batches.count if batches else None,
                )
                global_step = metrics["global_step"]
            else:
                if batches is None:
                    trainer = Trainer(model=model, args=arguments, train_dataset=dataset, callbacks=[probe])
                else:
                    trainer = counting_trainer(
                        batches.count,
                        model=model,
                        args=arguments,
                        train_dataset=dataset,
                        data_collator=batches.collator,
                        callbacks=[probe],
                    )
                reached("trainer ready")
                output = trainer.train()
                metrics, global_step = output.metrics, output.global_step
            reached("trained")
        except Exception as error:  # out of the GPU's memory or the host's (a CPU run): others end the run as failed
            if not is_out_of_memory(error):
                raise
            dump_memory_snapshot()  # before the trainer's memory is freed (the frames unwound have freed theirs)
            # The model itself may not fit (no step yet), or a step ran out of memory.
            step = probe.steps + 1 if probe.started else 0
            out_of_memory = probe.out_of_memory_at(error)  # read while the failing step's tensors are alive
            peak_allocated, reserved = probe.peak_allocated_bytes, probe.peak_reserved_bytes
            if peak_allocated is None and config.device == "cuda":
                peak_allocated, reserved = torch.cuda.max_memory_allocated(), torch.cuda.memory_reserved()
            trainer = model = None
            gc.collect()
            torch.cuda.empty_cache()
            emit(
                Error(
                    kind="oom",
                    message=out_of_memory_message(error),
                    step=step,
                    peak_allocated_bytes=peak_allocated,
                    reserved_bytes=reserved,
                    out_of_memory=out_of_memory,
                )
            )
            return EXIT_OOM
        except KeyboardInterrupt:
            dump_memory_snapshot()
            steady = probe.steady_state()  # of the steps it finished after warm-up, when it finished any
            if steady["steady_reason"] is not None:
                steady["steady_reason"] = (
                    f"stopped after {probe.steps} steps, before a steady one: the first {steady['warmup_steps']} "
                    "are warm-up"
                )
            emit(
                Done(
                    status="stopped",
                    steps=probe.steps,
                    samples=probe.samples,
                    train_runtime_s=None,
                    samples_per_second=None,
                    steady_samples_per_second=steady["steady_samples_per_second"],
                    warmup_steps=steady["warmup_steps"],
                    steady_reason=steady["steady_reason"],
                    peak_allocated_bytes=probe.peak_allocated_bytes,
                    peak_reserved_bytes=probe.peak_reserved_bytes,
                    bands=probe.last_bands,
                    probe_time_s=probe.probe_time_s,
                    probe_time_by_part_s=dict(probe.probe_time_by_part_s),
                    **probe.steady_phases(),
                    **probe.logged_values.fields(),
                    **data_counts(batches),
                )
            )
            return EXIT_STOPPED
    dump_memory_snapshot()
    steady = probe.steady_state()
    emit(
        Done(
            status="ok",
            steps=global_step,
            samples=probe.samples,
            train_runtime_s=metrics.get("train_runtime"),
            samples_per_second=metrics.get("train_samples_per_second"),
            steady_samples_per_second=steady["steady_samples_per_second"],
            warmup_steps=steady["warmup_steps"],
            steady_reason=steady["steady_reason"],
            train_loss=metrics.get("train_loss"),
            peak_allocated_bytes=probe.peak_allocated_bytes,
            peak_reserved_bytes=probe.peak_reserved_bytes,
            bands=probe.last_bands,
            probe_time_s=probe.probe_time_s,
            probe_time_by_part_s=dict(probe.probe_time_by_part_s),
            **probe.steady_phases(),
            compile_stats=compile_stats(compiled_frames) if compiled_frames else None,
            **probe.logged_values.fields(),
            **data_counts(batches),
        )
    )
    return EXIT_OK


def connect_rank_socket(path: str) -> int:
    """Connect to the rank launcher, say which rank this is, and hold the connection as this rank's lifeline;
    returns its descriptor, to write events to."""
    import socket

    from gpuanat.worker.lifeline import hold_lifeline_fd

    connection = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    connection.connect(path)
    header = {"rank": int(os.environ.get("RANK", "0")), "pid": os.getpid()}
    connection.sendall((json.dumps(header) + "\n").encode())
    fd = connection.detach()
    hold_lifeline_fd(fd)
    return fd


def main(argv: list[str] | None = None, started_monotonic_s: float | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m gpuanat.worker", description=__doc__)
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--events-fd", type=int, help="the pipe gpuanat reads events from")
    where.add_argument("--rank-socket", help="as a rank of a distributed run: the rank launcher's socket")
    run = parser.add_mutually_exclusive_group(required=True)
    run.add_argument("--config", help="RunConfig as JSON")
    run.add_argument("--warm-fd", type=int, help="prepare now, and read the run from this pipe (gpuanat.worker.warm)")
    args = parser.parse_args(argv)

    from gpuanat.core.vocabulary.config import RunConfig
    from gpuanat.core.vocabulary.protocol import Error, Milestone
    from gpuanat.worker.events import EventWriter, ParentGone

    writer = EventWriter(args.events_fd if args.rank_socket is None else connect_rank_socket(args.rank_socket))
    try:
        if args.warm_fd is not None:
            handed = _prepared_run(args.warm_fd, writer)
            if handed is None:  # gpuanat did not need this process after all
                return EXIT_OK
            config_json, started_monotonic_s = handed
        else:
            config_json = json.loads(args.config)
        signal.signal(signal.SIGTERM, _raise_keyboard_interrupt)
        config = RunConfig.from_json(config_json)
        if started_monotonic_s is not None:
            writer.emit(Milestone(name="started", monotonic_s=started_monotonic_s))
        return train(config, writer.emit)
    except ParentGone:
        return EXIT_STOPPED
    except KeyboardInterrupt:
        return EXIT_STOPPED
    except Exception as error:
        with contextlib.suppress(ParentGone):
            writer.emit(
                Error(kind="exception", message=f"{type(error).__name__}: {error}", traceback=traceback.format_exc())
            )
        traceback.print_exc()
        return EXIT_EXCEPTION


def _prepared_run(handoff_fd: int, writer: Any) -> tuple[dict[str, Any], float] | None:
    """As a prepared worker: import, say so, wait for the run; its configuration and when it arrived (the run's
    "started" point), or None when gpuanat closed the pipe without one."""
    import time

    from gpuanat.core.run.warm import PREPARED
    from gpuanat.core.vocabulary.protocol import Milestone
    from gpuanat.worker import warm

    handoff = warm.Handoff(handoff_fd)
    warm.prepare()
    writer.emit(Milestone(name=PREPARED, monotonic_s=time.monotonic()))
    handed = handoff.wait()
    if handed is None:
        return None
    payload, received_monotonic_s = handed
    warm.apply_environment(payload["environ"])
    return payload["config"], received_monotonic_s


if __name__ == "__main__":
    sys.exit(main())
