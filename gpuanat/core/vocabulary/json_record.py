"""A dataclass that reads and writes one JSON object byte for byte: the base of the run's result and its parts.

Results are stored in users' histories and committed under benchmarks/: a result written by an older gpuanat may
lack keys or carry keys no longer written, and its keys' order is part of what `json.dumps` prints. A `JsonRecord`
keeps both: `json_keys` is the object's keys in order (a field whose key is absent is None and is not written back),
`extra` holds the keys no field knows, written back in their place. So `to_json(from_json(x)) == x`, key order
included, for any object whose values the fields' decoders give back (plain values, nested records, lists of them).

Assigning a field whose key the object lacks adds its key at the end, as assigning a dict's key does.

Plain Python: no torch, no UI.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, Self


@dataclass
class JsonRecord:
    """Base of a JSON object's dataclass: the fields are its keys, by the same names."""

    json_keys: tuple[str, ...] = field(default=(), kw_only=True, compare=False, repr=False)
    """The object's keys in the order they are written: fields by their names, `extra`'s keys in their places.
    Left out when constructing: the class's `default_keys`."""
    extra: dict[str, Any] = field(default_factory=dict, kw_only=True, compare=False, repr=False)
    """Keys no field knows (written by another gpuanat version), with their values as read."""

    DECODERS: ClassVar[Mapping[str, Callable[[Any], Any]]] = {}
    """How a field's JSON value is read (nested records); a field not named here is its JSON value as it is."""

    def __post_init__(self) -> None:
        if not self.json_keys:
            object.__setattr__(self, "json_keys", self.default_keys())
        object.__setattr__(self, "_built", True)

    def __setattr__(self, name: str, value: Any) -> None:
        object.__setattr__(self, name, value)
        if self.__dict__.get("_built") and name not in self.json_keys and name in self._field_names():
            object.__setattr__(self, "json_keys", (*self.json_keys, name))

    @classmethod
    def _field_names(cls) -> frozenset[str]:
        return frozenset(f.name for f in dataclasses.fields(cls) if f.name not in ("json_keys", "extra"))

    @classmethod
    def default_keys(cls) -> tuple[str, ...]:
        """The keys of a record built by gpuanat now: its fields, in declaration order."""
        return tuple(f.name for f in dataclasses.fields(cls) if f.name not in ("json_keys", "extra"))

    def to_json(self) -> dict[str, Any]:
        """The JSON object: `json_keys` in order, each field's value encoded, unknown keys as read."""
        known = self._field_names()
        return {key: _encode(getattr(self, key)) if key in known else self.extra[key] for key in self.json_keys}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Self:
        """The record of a JSON object as any gpuanat version wrote it: a missing key reads as None (or empty, by the
        field's default), an unknown one is kept in `extra`; the key order is kept for `to_json`."""
        known = cls._field_names()
        values = {key: cls.DECODERS.get(key, _same)(value) for key, value in data.items() if key in known}
        extra = {key: value for key, value in data.items() if key not in known}
        record = cls(**values, extra=extra)
        object.__setattr__(record, "json_keys", tuple(data))
        return record


def _same(value: Any) -> Any:
    return value


def _encode(value: Any) -> Any:
    if isinstance(value, JsonRecord):
        return value.to_json()
    if isinstance(value, list):
        return [_encode(item) for item in value]
    return value


def record_or_as_is(record: type[JsonRecord]) -> Callable[[Any], Any]:
    """A decoder for a JSON object read as `record`; anything else (null, another shape) kept as it is."""
    return lambda value: record.from_json(value) if isinstance(value, dict) else value


def records_or_as_is(record: type[JsonRecord]) -> Callable[[Any], Any]:
    """A decoder for a list of JSON objects read as `record`s; other items and other values kept as they are."""
    return lambda value: (
        [record.from_json(item) if isinstance(item, dict) else item for item in value]
        if isinstance(value, list)
        else value
    )
