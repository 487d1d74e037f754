"""What a --data run's batches held: the share of padding, the data's own tokens a second, its rows' lengths.

The training child counts every micro-batch's token positions and, of them, the real ones (the attention mask's);
on the docs' random data there is no padding and every sample is `seq_len` tokens (docs/data.md).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from gpuanat.core.vocabulary.config import RunConfig
from gpuanat.core.vocabulary.protocol import Done

DATA_FIELDS = ("padding_percent", "real_tokens_per_second", "steady_real_tokens_per_second", "length_histogram")
"""The result's keys this module fills, in their order."""


@dataclass
class DataRates:
    values: dict[str, Any]
    """`DATA_FIELDS` by name; None where `unavailable` says why."""
    tokens_per_sample: float
    """Token positions a sample held on average (padding included): `seq_len` on random data."""
    unavailable: dict[str, str] = field(default_factory=dict)


def data_rates(config: RunConfig, done: Done | None, steady_samples_per_second: float | None) -> DataRates:
    """The run's data fields from what the child counted (`Done.trained_tokens` …), at its rates."""
    values: dict[str, Any] = dict.fromkeys(DATA_FIELDS)
    if config.data is None:
        reason = "synthetic data: every sample is --seq-len random tokens, no padding"
        return DataRates(values, float(config.seq_len), dict.fromkeys(DATA_FIELDS, reason))
    unavailable: dict[str, str] = {}
    trained = done.trained_tokens if done else None
    real = done.real_tokens if done else None
    samples = done.batch_samples if done else None
    if not trained or real is None or not samples:
        reason = "the run trained no batch" if done else "the run did not finish"
        return DataRates(values, float(config.seq_len), dict.fromkeys(DATA_FIELDS, reason))
    values["padding_percent"] = 100.0 * (trained - real) / trained
    real_per_sample = real / samples
    if done is not None and done.samples_per_second:
        values["real_tokens_per_second"] = done.samples_per_second * real_per_sample
    else:
        unavailable["real_tokens_per_second"] = "no samples/s: the run did not finish"
    if steady_samples_per_second is not None:
        values["steady_real_tokens_per_second"] = steady_samples_per_second * real_per_sample
    else:
        unavailable["steady_real_tokens_per_second"] = "no steady samples/s"
    values["length_histogram"] = done.length_histogram if done else None
    if values["length_histogram"] is None:
        unavailable["length_histogram"] = "not reported by the training process"
    return DataRates(values, trained / samples, unavailable)
