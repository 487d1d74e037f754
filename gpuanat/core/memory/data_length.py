"""The sequence length a --data run is predicted at: its longest batch's, which bounds the peak (docs/data.md).

Every prediction of a --data run goes through here — `gpuanat predict`, the prediction a run stores and its error,
the dashboard's techniques panel, fit's first batch and tune's refusals — so that they all agree. The rows' token
lengths come from the parent's data check (`gpuanat.dataset.load.tokenized`, which imports datasets): this module
takes only the longest of them, and stays plain Python.
"""

from __future__ import annotations

from collections.abc import Sequence

from gpuanat.core.memory.predict import prediction
from gpuanat.core.vocabulary.config import RunConfig
from gpuanat.core.vocabulary.result import Prediction


def longest_row(lengths: Sequence[int]) -> int:
    """The longest row's tokens (1 for no rows: a batch is at least one position long)."""
    return max(lengths, default=1)


def trained_seq_len(config: RunConfig, longest: int | None) -> int:
    """The length `config`'s longest batch takes, whose rows are at most `longest` tokens: --seq-len where every row
    is padded to it (`--padding max`) or rows are packed into it (`pack`), and without --data or its lengths; else
    (`--padding longest`) the longest row, truncated at --seq-len."""
    if config.data is None or longest is None or config.padding != "longest":
        return config.seq_len
    return max(1, min(config.seq_len, longest))


def at_data_length(config: RunConfig, longest: int | None) -> RunConfig:
    """`config` at the length its data trains at (`trained_seq_len`): what its memory is predicted for."""
    length = trained_seq_len(config, longest)
    return config if length == config.seq_len else config.replace(seq_len=length)


def data_prediction(config: RunConfig, longest: int | None) -> Prediction | None:
    """`prediction` at the data's length; its `seq_len` says that length where it is not --seq-len."""
    sized = at_data_length(config, longest)
    predicted = prediction(sized)
    if predicted is not None and sized.seq_len != config.seq_len:
        predicted.seq_len = sized.seq_len  # (a key of its JSON from here on)
    return predicted
