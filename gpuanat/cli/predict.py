"""`gpuanat predict`: memory bands, peaks and the largest batch that fits, without running. The whole model
compiled is refused as a config it cannot describe is (exit 2), having printed what is exact and why the rest is
not predicted."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from gpuanat.cli.common import EXIT_OK, EXIT_USAGE, fail_usage, validated_config
from gpuanat.cli.data import check_data
from gpuanat.core.vocabulary.config import RunConfig
from gpuanat.core.vocabulary.errors import ConfigError


def data_seq_len(config: RunConfig) -> RunConfig:
    """`config` at the length its --data's longest batch takes (`data_length.trained_seq_len`, as every prediction
    of a --data run), which bounds the peak; one line on stderr says which length that is and why."""
    from gpuanat.core.memory.data_length import longest_row, trained_seq_len

    try:
        lengths = check_data(config).lengths
    except ConfigError as error:
        fail_usage(str(error))
    length = trained_seq_len(config, longest_row(lengths))
    why = (
        f"the longest of --data's {len(lengths)} rows (--padding longest"
        + (f"; rows past --seq-len {config.seq_len} truncated)" if length == config.seq_len else ")")
        if config.padding == "longest"
        else f"--seq-len: --padding {config.padding} makes every batch {config.seq_len} tokens a row"
    )
    print(f"gpuanat: predict: at seq {length}, {why}", file=sys.stderr)
    return config.replace(seq_len=length)


def command_predict(args: argparse.Namespace) -> int:
    from gpuanat.core.measure.nvml_source import nvml_status
    from gpuanat.core.memory.allocation_templates import largest_batch, version_differences
    from gpuanat.core.memory.compiled import COMPILE_UNPREDICTED_FIELDS, compile_unpredicted_reason
    from gpuanat.core.memory.fit_ladder import fit_ladder
    from gpuanat.core.memory.measured_nearby import measured_nearby
    from gpuanat.core.memory.model_config import architecture_of
    from gpuanat.core.memory.predict import (
        HOST_MEMORY_UNAVAILABLE,
        estimate_memory,
        fits_in,
        host_prediction,
        max_batch_caveat,
        prediction,
        unreadable_model_reason,
    )
    from gpuanat.core.memory.sizes import parse_size
    from gpuanat.core.store.report import format_bytes

    config = validated_config(args, cuda_available=True)
    unreadable = unreadable_model_reason(config)
    if unreadable is not None:
        fail_usage(f"--model: {unreadable}")
    if config.ranks is None:  # --gpus all: as many as NVML lists
        from gpuanat.core.measure.gpus import read_gpus

        count = len(read_gpus())
        if count == 0:
            fail_usage("--gpus: all needs NVML to count the GPUs, and it lists none here; give a count, e.g. --gpus 8")
        config = config.replace(gpus=str(count))
    asked_seq_len = config.seq_len
    if config.data is not None:
        config = data_seq_len(config)
    on_cpu = config.device == "cpu"
    gpu_memory: int | None = None
    source = "--gpu-memory"
    if on_cpu:  # its tensors are in host memory: no GPU to fit
        if args.gpu_memory is not None:
            fail_usage("--gpu-memory: a CPU run's tensors are in host memory; leave out --device cpu to fit a GPU")
        source = "CPU run: its tensors are in host memory, no GPU's"
    elif args.gpu_memory is not None:
        try:
            gpu_memory = parse_size(args.gpu_memory)
        except ValueError as error:
            fail_usage(f"--gpu-memory: {error}")
    else:
        nvml = nvml_status()
        if nvml.available and nvml.gpu_total_bytes:
            gpu_memory, source = nvml.gpu_total_bytes[0], f"NVML: {nvml.gpu_names[0]}"
        else:
            source = f"no GPU memory to fit: {nvml.reason or 'no GPU'}; give --gpu-memory"
    predicted = host_prediction(config) if on_cpu else prediction(config)
    assert predicted is not None
    if config.seq_len != asked_seq_len:  # as a --data run's stored prediction says it (`data_length.data_prediction`)
        predicted.seq_len = config.seq_len
    uncovered = compile_unpredicted_reason(config)
    largest = largest_batch(config, gpu_memory) if gpu_memory is not None and uncovered is None else None
    result: dict[str, Any] = {
        "config": config.to_json(),
        **predicted.to_json(),
        "gpu_memory_bytes": gpu_memory,
        "gpu_memory_source": source,
        "max_batch_size": largest.batch_size if largest else None,
        "max_batch_method": largest.method if largest else None,
        "max_batch_least_left_bytes": largest.least_left_bytes if largest else None,
        "max_batch_recorded_with": largest.recorded_with if largest else None,
        "max_batch_size_model": largest.model_batch_size if largest else None,
        "max_batch_caveat": max_batch_caveat(config) if largest and largest.method == "model" else None,
        "fit_ladder": ([step.to_json() for step in fit_ladder(config, gpu_memory)] if gpu_memory is not None else None),
    }
    nearby = None if on_cpu or uncovered else measured_nearby(config, architecture_of(config).family)
    result["measured_nearby"] = nearby.text if nearby else None
    unavailable = dict.fromkeys((*COMPILE_UNPREDICTED_FIELDS, "max_batch_size"), uncovered) if uncovered else {}
    if on_cpu:
        unavailable |= HOST_MEMORY_UNAVAILABLE
    if unavailable:
        result["unavailable"] = unavailable
    exit_code = EXIT_OK
    if uncovered is not None:
        print(
            "gpuanat: predict: --compile: the whole model compiled is not predicted (its activations, peaks and "
            "largest batch; why: in the output); --compile-regions is",
            file=sys.stderr,
        )
        exit_code = EXIT_USAGE
    if args.json:
        print(json.dumps(result))
        return exit_code
    each = f", each of {predicted.ranks} ranks" if (predicted.ranks or 1) > 1 else ""
    where = ", in host memory (process RAM)" if on_cpu else ""
    print(
        f"Prediction for {config.model or config.preset} {config.techniques_summary()}, seq {config.seq_len}{each}"
        f"{where}:"
    )
    for key in (
        "weights_bytes",
        "gradients_bytes",
        "optimizer_state_bytes",
        "activations_bytes",
        "cuda_context_bytes",
        "peak_allocated_bytes",
        "peak_reserved_bytes",
        "peak_device_bytes",
    ):
        reason = f"  ({HOST_MEMORY_UNAVAILABLE[key]})" if on_cpu and key in HOST_MEMORY_UNAVAILABLE else ""
        if not reason and result[key] is None and key in unavailable:
            reason = "  (not predicted: the whole model compiled)"
        print(f"  {key.removesuffix('_bytes').replace('_', ' '):<22} {format_bytes(result[key]):>11}{reason}")
        if key == "activations_bytes" and result["logits_bytes"]:
            print(f"    {'of which logits':<20} {format_bytes(result['logits_bytes']):>11}")
        if key == "peak_allocated_bytes" and result["ddp_first_buckets_bytes"]:
            buckets = format_bytes(result["ddp_first_buckets_bytes"])
            print(
                f"    of which {buckets} are DDP's first buckets, which a rank may still hold at step 2 beside the "
                "rebuilt ones (20 of 40 ranks did on H200s)"
            )
    if uncovered is not None:
        print(f"No prediction of the activations, the peaks or the largest batch: {uncovered}.")
        other = result["caveat"].removeprefix(uncovered).removeprefix("; ")
        if other:
            print(f"Not checked: {other}.")
    elif result["caveat"]:
        print(f"Not checked: {result['caveat']}.")
    if result["measured_nearby"] and result["measured_nearby"] not in (result["caveat"] or ""):
        print(f"Measured nearby: {result['measured_nearby']}.")
    if gpu_memory is None:
        print(f"Largest batch that fits: — ({source})")
    elif uncovered is not None:
        print(
            f"On {format_bytes(gpu_memory)} ({source}): batch {config.batch_size} not predicted; largest batch that "
            "fits: — (not predicted: the whole model compiled)"
        )
        print_fit_ladder(result["fit_ladder"], config, gpu_memory)
    else:
        estimate = estimate_memory(config)
        fits = "fits" if fits_in(estimate, gpu_memory) else "does NOT fit"
        how = (
            f"replaying a recorded run's allocations, {format_bytes(result['max_batch_least_left_bytes'])} left at "
            f"its tightest; the bytes model says {result['max_batch_size_model']}"
            if result["max_batch_method"] == "replay"
            else "replaying the allocations derived from the model and techniques"
            if result["max_batch_method"] == "stream"
            else "the bytes model"
        )
        print(
            f"On {format_bytes(gpu_memory)} ({source}): batch {config.batch_size} {fits}; "
            f"largest batch that fits: {result['max_batch_size']} ({how})"
        )
        if result["max_batch_caveat"]:
            print(f"  caveat: {result['max_batch_caveat']}")
        if fits == "fits" and result["peak_device_bytes"] > gpu_memory:
            cache = result["peak_reserved_bytes"] - result["peak_allocated_bytes"]
            print(
                f"  (its peak device counts {format_bytes(cache)} of allocator cache above the peak allocated: near "
                "the limit the allocator frees its unused segments before it fails, as `fits` assumes)"
            )
        print_fit_ladder(result["fit_ladder"], config, gpu_memory)
        recorded_with = result["max_batch_recorded_with"]
        if recorded_with:
            differences = version_differences(recorded_with)
            print(
                f"  the replayed run: {recorded_with['gpu']}, torch {recorded_with['torch']}, transformers "
                f"{recorded_with['transformers']}"
                + (f" ({'; '.join(differences)}: its allocations may differ)" if differences else "")
            )
    return exit_code


def print_fit_ladder(ladder: list[dict[str, Any]], config: Any, gpu_memory: int) -> None:
    """What makes a run that does not fit fit, cheapest technique first, each on top of those before it."""
    from gpuanat.core.store.report import format_bytes

    if not ladder:
        return
    gpus = f"{config.ranks} × " if (config.ranks or 1) > 1 else ""
    print(f"What makes it fit on {gpus}{format_bytes(gpu_memory)}, cheapest first (each on top of those before):")
    for step in ladder:
        if step["refused"]:
            print(f"  · {step['technique']:<44} left out: {step['refused']}")
            continue
        verdict = "fits" if step["fits"] else "does not fit"
        if step["fits"] and step["peak_device_bytes"] > gpu_memory:  # as for the run itself, above
            verdict = "fits (its allocator cache given back near the limit)"
        print(
            f"  + {step['technique']:<44} {step['flags']:<40} peak {format_bytes(step['peak_device_bytes']):>10}"
            f"  {verdict}"
        )
    if not any(step["fits"] for step in ladder):
        smaller = "a smaller --batch-size or --seq-len" if config.batch_size > 1 else "a shorter --seq-len"
        print(f"  None of these makes it fit: {smaller}, more GPUs (--gpus N), or a larger GPU.")
