"""What a watch says about its process tree: one JSON-ready record per sample, the record that ends the watch,
and the watched run's result.

`WatchRecords.record` reads one sample in terms of the watched tree: host CPU and RSS of the tree and of each
process, GPU memory of the tree on every GPU it uses (NVML per-process), GPU utilization (per process where NVML
reports it, else device-wide, labelled), the device's other processes, how NVML's PIDs relate to ours
(`pid_namespace`), and, once a process of the tree publishes probe events (`ObservedRun`), the step, throughput
and memory bands, overall and per rank, exactly as for runs gpuanat launched. Reading a sample raises the
observed run's peaks, which the watched run's result reports (`watched_result`). `final_record` says the process
exited.

Plain Python: no torch, no UI. Nothing here samples or writes the history; the session hands each sample in.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import psutil

from gpuanat.core.measure.anatomy import (
    NO_GPU_READINGS,
    MemoryBands,
    assemble_bands,
    gradients_after_backward_bytes,
)
from gpuanat.core.measure.failure import Readings, bands_readings, modules_json, out_of_memory_json, read_the_gpu
from gpuanat.core.measure.gpm import throttle_names
from gpuanat.core.measure.observed_run import THROUGHPUT_WINDOW_S, ObservedRun
from gpuanat.core.measure.pid_namespace import PidMapping, PidNamespaceResolver
from gpuanat.core.measure.run_state import RankEvents
from gpuanat.core.measure.samples import ACTIVITY_READINGS, GpuSample, NvmlStatus, Sample
from gpuanat.core.operations.anatomy import operations_anatomy
from gpuanat.core.vocabulary.protocol import Error, Operations, OutOfMemory, ProbeBands
from gpuanat.core.watch.loop_kind import ProbeHint, probe_hint
from gpuanat.core.watch.publications import Publications
from gpuanat.core.watch.target import WatchTarget

# `samples.ACTIVITY_READINGS` (issue #51) go in each record's GPU entry, named as in `GpuSample`, None where not read;
# `throttle_reasons` beside them says the set reasons in words.


def _gpu_of(gpus: Sequence[GpuSample], nvml_pids: set[int]) -> GpuSample | None:
    """The GPU a process trains on: where NVML lists the most of its memory. A rank may hold a small context on
    another GPU too (seen on 4 H200s: a torchrun rank with 610 MiB on rank 0's GPU and 11.7 GiB on its own)."""
    listed = [gpu for gpu in gpus if any(process.pid in nvml_pids for process in gpu.processes)]
    return max(listed, key=lambda gpu: _gpu_used_by(gpu, nvml_pids)[0], default=None)


def _gpu_used_by(gpu: GpuSample, nvml_pids: set[int]) -> tuple[int, bool]:
    """Memory NVML reports for `nvml_pids` on `gpu`, and whether any of them is listed without a number."""
    used = 0
    unknown = False
    for process in gpu.processes:
        if process.pid in nvml_pids:
            if process.used_bytes is None:
                unknown = True
            else:
                used += process.used_bytes
    return used, unknown


class WatchRecords:
    """Turns samples of one watched process tree into records; keeps what the next one and the result need."""

    def __init__(
        self,
        target: WatchTarget,
        nvml: NvmlStatus,
        observed: ObservedRun,
        *,
        clock: Callable[[], float],
        resolver: PidNamespaceResolver,
        publications: Publications | None,
        kind: str,
        description: Mapping[str, Any] | None,
    ) -> None:
        """`observed` is what the tree's events said (the session feeds it); `publications` None: they come
        another way than publication files. `kind` and `description` (config entries that say what ran; default
        the PID and command) are for the history."""
        self.target = target
        self.kind = kind
        self._description = (
            dict(description)
            if description is not None
            else {"watched_pid": target.pid, "command": target.command or target.name}
        )
        self.nvml = nvml
        self._clock = clock
        self._resolver = resolver
        self._publications = publications
        self.started_s = clock()
        self.observed = observed
        self.last_record: dict[str, Any] | None = None
        self.mapping = PidMapping()
        self._modules_recorded: ProbeBands | None = None
        self._failure_recorded: OutOfMemory | None = None
        self._other_process_names: dict[int | None, str | None] = {}
        """The names of the other processes on the GPUs, kept while NVML lists them (read once, not every sample)."""

    def record(self, sample: Sample, tree_pids: list[int]) -> dict[str, Any]:
        """One record from one sample of the tree `tree_pids` (the watched process first), after its events."""
        host = sample.host
        nvml_pids_listed = {process.pid for gpu in sample.gpus for process in gpu.processes}
        nvml_pids_listed |= {entry.pid for gpu in sample.gpus for entry in gpu.process_utilization or ()}
        self.mapping = mapping = self._resolver.resolve(nvml_pids_listed, tree_pids)
        tree_nvml_pids = mapping.nvml_pids_of(tree_pids)
        observed = self.observed
        run = observed.run  # the state of the process that speaks for the run

        gpus: list[dict[str, Any]] = []
        gpu_memory_bytes: int | None = 0
        memory_unknown = False
        for gpu in sample.gpus:
            used, unknown = _gpu_used_by(gpu, tree_nvml_pids)
            memory_unknown |= unknown
            gpu_memory_bytes = (gpu_memory_bytes or 0) + used
            on_gpu = any(process.pid in tree_nvml_pids for process in gpu.processes)
            process_util = None
            if gpu.process_utilization is not None:
                process_util = sum(
                    entry.sm_util_percent for entry in gpu.process_utilization if entry.pid in tree_nvml_pids
                )
            gpus.append(
                {
                    "index": gpu.index,
                    "name": gpu.name,
                    "uses_it": on_gpu,
                    "process_memory_bytes": used if on_gpu else 0,
                    "used_bytes": gpu.used_bytes,
                    "total_bytes": gpu.total_bytes,
                    "other_processes_bytes": gpu.used_bytes - used if gpu.used_bytes is not None else None,
                    "device_util_percent": gpu.gpu_util_percent,
                    "process_util_percent": process_util,
                    "memory_util_percent": gpu.memory_util_percent,
                    "power_w": gpu.power_w,
                    "temperature_c": gpu.temperature_c,
                    **{name: getattr(gpu, name) for name in ACTIVITY_READINGS},
                    "throttle_reasons": throttle_names(gpu.clocks_event_reasons),
                    "nvml_error": gpu.nvml_error,
                    "xid_errors": list(gpu.xid_errors) if gpu.xid_errors is not None else None,
                }
            )
        gpu_memory_reason = None
        if not sample.gpus:
            gpu_memory_bytes = None
            gpu_memory_reason = f"{NO_GPU_READINGS}: {self.nvml.reason or 'NVML unavailable'}"
        elif not gpu_memory_bytes and (failed := [gpu.nvml_error for gpu in sample.gpus if gpu.nvml_error]):
            gpu_memory_bytes = None  # a GPU that gave no readings may hold the tree's memory
            gpu_memory_reason = "; ".join(failed)
        elif memory_unknown and not gpu_memory_bytes:
            gpu_memory_bytes = None
            gpu_memory_reason = "NVML lists the process without its memory (MIG or no permission)"
        elif mapping.foreign and not tree_nvml_pids:
            gpu_memory_bytes = None
            gpu_memory_reason = "NVML's PIDs are from another PID namespace and could not be mapped to this process"

        used_gpus = [entry for entry in gpus if entry["uses_it"]] or gpus
        gpu_util_percent: float | None = None
        gpu_util_scope: str | None = None
        process_utils = [
            entry["process_util_percent"] for entry in used_gpus if entry["process_util_percent"] is not None
        ]
        if used_gpus and len(process_utils) == len(used_gpus) and any(entry["uses_it"] for entry in gpus):
            gpu_util_percent, gpu_util_scope = sum(process_utils) / len(process_utils), "process"
        else:
            device_utils = [
                entry["device_util_percent"] for entry in used_gpus if entry["device_util_percent"] is not None
            ]
            if device_utils:
                gpu_util_percent, gpu_util_scope = sum(device_utils) / len(device_utils), "device"

        memory_by_local_pid: dict[int, int] = collections.defaultdict(int)
        other_processes = []
        named: dict[int | None, str | None] = {}
        for gpu in sample.gpus:
            for process in gpu.processes:
                local_pid = mapping.local_by_nvml.get(process.pid)
                if process.pid in tree_nvml_pids and local_pid is not None:
                    memory_by_local_pid[local_pid] += process.used_bytes or 0
                else:
                    if local_pid not in named:
                        named[local_pid] = (
                            self._other_process_names[local_pid]
                            if local_pid in self._other_process_names
                            else _process_name(local_pid)
                        )
                    other_processes.append(
                        {
                            "gpu": gpu.index,
                            "pid": process.pid,
                            "local_pid": local_pid,
                            "name": named[local_pid],
                            "used_bytes": process.used_bytes,
                        }
                    )
        self._other_process_names = named  # one that leaves the GPU is forgotten: a PID used again is named again
        processes = [
            {
                "pid": p.pid,
                "parent_pid": p.parent_pid,
                "name": p.name,
                "cpu_percent": p.cpu_percent,
                "rss_bytes": p.rss_bytes,
                "gpu_memory_bytes": memory_by_local_pid.get(p.pid),
            }
            for p in host.processes
        ]

        if host.rss_bytes is not None:
            observed.peak_rss_bytes = max(observed.peak_rss_bytes or 0, host.rss_bytes)
        if host.cpu_percent is not None:
            observed.peak_cpu_percent = max(observed.peak_cpu_percent or 0.0, host.cpu_percent)
        if gpu_memory_bytes is not None:
            observed.peak_gpu_memory_bytes = max(observed.peak_gpu_memory_bytes or 0, gpu_memory_bytes)
        main_gpu, main_process_bytes = self._main_gpu(sample, tree_nvml_pids)
        if main_gpu is not None:
            observed.gpu_name, observed.device_total_bytes = main_gpu.name, main_gpu.total_bytes
            observed.gpu_readings.append(
                (sample.t_s, dataclasses.replace(main_gpu, processes=(), process_utilization=None))
            )
            if main_gpu.used_bytes is not None:
                observed.peak_device_used_bytes = max(observed.peak_device_used_bytes or 0, main_gpu.used_bytes)

        published = observed.publisher_pid is not None
        bands = bands_unavailable = None
        if published:
            memory = self._bands(
                main_gpu,
                main_process_bytes,
                run.last_step.reserved_bytes if run.last_step else None,
                main_gpu.used_bytes if main_gpu else None,
            )
            bands_unavailable = memory.unavailable
            bands = memory.values()
        last_step = run.last_step
        done = run.done
        record: dict[str, Any] = {
            "pid": self.target.pid,
            "t": round(sample.t_s - self.started_s, 3),
            "exited": False,
            "cpu_percent": host.cpu_percent,
            "rss_bytes": host.rss_bytes,
            "gpu_memory_bytes": gpu_memory_bytes,
            "gpu_memory_reason": gpu_memory_reason,
            "gpu_util_percent": gpu_util_percent,
            "gpu_util_scope": gpu_util_scope,
            "gpus": gpus,
            "processes": processes,
            "other_gpu_processes": other_processes,
            "pid_namespace": None
            if not mapping.other_namespace
            else {
                "note": mapping.note,
                "mapped": {
                    str(nvml_pid): local for nvml_pid, local in mapping.local_by_nvml.items() if nvml_pid != local
                },
                "unmapped": list(mapping.foreign),
            },
            "published": published,
            "publisher_pid": observed.publisher_pid,
            "publication_reason": None if published else self.publication_reason(),
            "probe_hint": None if published or self._publications is None else self.probe_hint.to_json(),
            "step": last_step.step if last_step else None,
            "total_steps": run.model.total_steps if run.model else None,
            "samples": last_step.samples if last_step else None,
            # the latest the loop logged (with the step of that log), and its lowest loss so far
            "loss": run.loss.loss,
            "loss_step": run.loss.logged_step,
            "min_loss": run.loss.min_loss,
            "learning_rate": run.loss.learning_rate,
            "grad_norm": run.loss.grad_norm,
            "samples_per_second": run.samples_per_second(THROUGHPUT_WINDOW_S),
            "steady_samples_per_second": done.steady_samples_per_second if done else None,
            "params": run.model.params if run.model else None,
            "training_done": done is not None,
            "bands": bands,
            "bands_unavailable": bands_unavailable,
            "device_memory_used_bytes": main_gpu.used_bytes if main_gpu else None,
            "gradients_after_backward_bytes": gradients_after_backward_bytes(run.probe_bands),
            "bands_measured_at_step": run.probe_bands.measured_at_step if run.probe_bands else None,
            "malformed_events": observed.malformed,
            "ranks": self._ranks(sample, mapping),
            # the probe's profile of its operations (asked with GPUANAT_PROFILE_OPS or its profile_ops=), in the
            # first record after it came, without the kernel rows (the result and the final record have them)
            "operations_anatomy": self._new_operations(run.operations),
            # memory by module of the bands measured last, and an out-of-memory failure: each in the first record
            # after it came (the final record has both), so that a record stays small at every sample
            "modules": self._new_modules(run.probe_bands),
            "out_of_memory": self._new_out_of_memory(run.error),
        }
        self.last_record = record
        return record

    def _new_operations(self, operations: Operations | None) -> dict[str, Any] | None:
        """The operations anatomy when it is new since the last record (its groups and figures), else None."""
        if operations is None or operations is getattr(self, "_operations_recorded", None):
            return None
        self._operations_recorded = operations
        return {key: value for key, value in operations_anatomy(operations).items() if key != "kernels"}

    def _new_modules(self, bands: ProbeBands | None) -> list[dict[str, Any]] | None:
        """Memory by module of `bands` when they are new since the last record, else None."""
        if bands is None or bands is self._modules_recorded:
            return None
        self._modules_recorded = bands
        return modules_json(bands)

    def _new_out_of_memory(self, error: Error | None) -> dict[str, Any] | None:
        """The out-of-memory failure (`out_of_memory_json`) when it is new since the last record, else None."""
        if error is None or error.out_of_memory is None or error.out_of_memory is self._failure_recorded:
            return None
        self._failure_recorded = error.out_of_memory
        return out_of_memory_json(error, 0)

    def _ranks(self, sample: Sample, mapping: Any) -> list[dict[str, Any]]:
        """Every publishing process (each rank of a distributed job) with its GPU and its own bands, computed as
        one GPU's are: from its probe and NVML's reading of the GPU NVML lists its PID on."""
        ranks = []
        for position, publisher in enumerate(self.observed.publishers.values()):
            nvml_pids = mapping.nvml_pids_of([publisher.pid])
            gpu = _gpu_of(sample.gpus, nvml_pids)
            used = _gpu_used_by(gpu, nvml_pids)[0] if gpu is not None else None
            hello = self.observed.run.hello
            no_gpu = (
                "CPU run: it uses no GPU memory"
                if hello is not None and hello.device != "cuda"
                else None
                if gpu is not None
                else "NVML lists no GPU memory of this process"
            )
            memory = _bands_of(
                publisher.state,
                Readings(
                    publisher.reserved_bytes,
                    gpu.used_bytes if gpu else None,
                    used,
                    gpu.total_bytes if gpu else None,
                ),
                no_gpu,
            )
            ranks.append(
                {
                    "pid": publisher.pid,
                    "rank": publisher.rank if publisher.rank is not None else position,
                    "gpu_index": gpu.index if gpu else None,
                    "step": publisher.step,
                    "used_bytes": gpu.used_bytes if gpu else None,
                    "total_bytes": gpu.total_bytes if gpu else None,
                    "gradients_after_backward_bytes": gradients_after_backward_bytes(publisher.probe_bands),
                    "bands": memory.values(),
                    "bands_unavailable": memory.unavailable,
                }
            )
        return sorted(ranks, key=lambda entry: entry["rank"])

    def publication_reason(self) -> str:
        if self._publications is None:
            return "the process has sent no probe events yet"
        problems = self._publications.problems
        if problems:
            pid, problem = next(iter(problems.items()))
            return f"publication of PID {pid} not trusted: {problem}"
        return self.probe_hint.reason

    @functools.cached_property
    def probe_hint(self) -> ProbeHint:
        """Which probe the watched script needs, or that it has one (read off its text once)."""
        return probe_hint(self.target.arguments, self.target.cwd)

    def _main_gpu(self, sample: Sample, tree_nvml_pids: set[int]) -> tuple[GpuSample | None, int | None]:
        """The GPU whose memory the bands describe — the publishing process's, else the tree's largest — and
        the watched memory on it."""
        if not sample.gpus:
            return None, None
        publisher = self.observed.publisher_pid
        candidates = self.mapping.nvml_pids_of([publisher]) if publisher is not None else set()
        best: tuple[int, GpuSample] | None = None
        for pids in (candidates, tree_nvml_pids):
            for gpu in sample.gpus:
                used, _ = _gpu_used_by(gpu, pids)
                if any(process.pid in pids for process in gpu.processes) and (best is None or used > best[0]):
                    best = (used, gpu)
            if best is not None:
                return best[1], best[0]
        return sample.gpus[0], None

    def _bands(
        self,
        gpu: GpuSample | None,
        process_used_bytes: int | None,
        reserved_bytes: int | None,
        device_used_bytes: int | None,
    ) -> MemoryBands:
        run = self.observed.run
        hello = run.hello
        no_gpu_reason = None
        if hello is not None and hello.device != "cuda":
            no_gpu_reason = "CPU run: it uses no GPU memory"
        elif gpu is None:
            no_gpu_reason = f"{NO_GPU_READINGS}: {self.nvml.reason or 'NVML unavailable'}"
        return _bands_of(
            run,
            Readings(reserved_bytes, device_used_bytes, process_used_bytes, gpu.total_bytes if gpu else None),
            no_gpu_reason,
        )

    def final_record(self, *, exit_code: int | None) -> dict[str, Any]:
        """The record that ends the watch because the process exited."""
        observed = self.observed
        run = observed.run  # the state of the process that speaks for the run
        # a process that ran out of memory often exits before the next sample: the failing allocation's bands, from
        # the readings its probe took then (`bands_readings`)
        failure = (
            _bands_of(run, Readings(None, None, None, observed.device_total_bytes), None)
            if run.failure_shown is not None
            else None
        )
        return {
            "pid": self.target.pid,
            "t": round(self._clock() - self.started_s, 3),
            "exited": True,
            "bands": failure.values() if failure else None,
            "bands_unavailable": failure.unavailable if failure else None,
            "exit_code": exit_code,
            "training_done": run.done is not None,
            # the steps `done` counted: a publication throttles plain step lines, and may skip the last ones
            "steps": run.done.steps if run.done else (run.last_step.step if run.last_step else None),
            "peak_gpu_memory_bytes": observed.peak_gpu_memory_bytes,
            "peak_rss_bytes": observed.peak_rss_bytes,
            "steady_samples_per_second": run.done.steady_samples_per_second if run.done else None,
            "malformed_events": observed.malformed,
            "operations_anatomy": operations_anatomy(run.operations) if run.operations else None,
            "modules": modules_json(run.probe_bands),
            "out_of_memory": out_of_memory_json(run.error, 0),
        }

    def observed_pids(self) -> list[int]:
        if self.last_record is None:
            return []
        return [process["pid"] for process in self.last_record["processes"]]

    def config(self) -> dict[str, Any]:
        """What the run is, for the history: the techniques the probe reported, else the command."""
        config: dict[str, Any] = dict(self.observed.run.hello.config) if self.observed.run.hello else {}
        config.update(self._description)
        return config

    def watched_s(self) -> float:
        """Seconds since the watch began, to the millisecond."""
        return round(self._clock() - self.started_s, 3)


def _bands_of(state: RankEvents, readings: Readings, no_gpu_reason: str | None) -> MemoryBands:
    """The bands of one publishing process from its probe's and `readings` taken beside them; after an out-of-memory
    failure, the failing allocation's bands with that moment's readings (`bands_readings`)."""
    failed = state.failure_shown
    readings = bands_readings(readings, failed)
    if read_the_gpu(failed):
        no_gpu_reason = None  # its probe read the GPU at the failing allocation
    return assemble_bands(
        state.probe_bands,
        reserved_bytes=readings.reserved_bytes,
        device_used_bytes=readings.device_used_bytes,
        device_total_bytes=readings.device_total_bytes,
        process_used_bytes=readings.process_used_bytes,
        no_gpu_reason=no_gpu_reason,
    )


def _process_name(pid: int | None) -> str | None:
    if pid is None:
        return None
    try:
        return psutil.Process(pid).name()
    except psutil.Error:
        return None
