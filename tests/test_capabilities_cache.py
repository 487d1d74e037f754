"""The capability probe's answer is reused while the environment it depends on is unchanged (issue #18: every run
waited for a subprocess that imports torch and initialises CUDA before its child could start). Real probes, in a
throwaway cache folder."""

from __future__ import annotations

import json
import os
import time

import pytest

from gpuanat.core.run.runner import (
    CAPABILITIES_CACHE_S,
    capabilities_cache_path,
    capabilities_key,
    probe_capabilities,
)


@pytest.fixture
def cache_home(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.delenv("GPUANAT_NO_CAPABILITIES_CACHE", raising=False)
    return tmp_path


def _plant(key: str, torch_version: str, probed_at: float) -> None:
    """A cache entry whose torch version no real probe would give, to tell a cached answer from a probed one."""
    path = capabilities_cache_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    real = json.loads(path.read_text())["capabilities"] if path.exists() else {"cuda_available": False}
    path.write_text(
        json.dumps({"key": key, "probed_at": probed_at, "capabilities": {**real, "torch_version": torch_version}})
    )


def test_the_answer_is_reused_for_the_same_environment_and_not_for_another(cache_home, monkeypatch):
    probed = probe_capabilities()
    path = capabilities_cache_path()
    assert path.parent == cache_home / "gpuanat" and oct(path.stat().st_mode & 0o777) == "0o600"
    _plant(capabilities_key(), "cached-marker", time.time())
    assert probe_capabilities().torch_version == "cached-marker"  # read, not probed
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "7")  # another set of GPUs: probe again
    assert probe_capabilities().torch_version == probed.torch_version
    assert json.loads(path.read_text())["key"] == capabilities_key()  # and remembered for it


def test_an_old_entry_garbage_or_the_switch_off_mean_a_real_probe(cache_home, monkeypatch):
    real = probe_capabilities(use_cache=False).torch_version
    _plant(capabilities_key(), "too-old", time.time() - CAPABILITIES_CACHE_S - 1)
    assert probe_capabilities().torch_version == real
    capabilities_cache_path().write_bytes(b"\x00garbage{{{" * 10)
    assert probe_capabilities().torch_version == real
    assert json.loads(capabilities_cache_path().read_text())["capabilities"]["torch_version"] == real
    _plant(capabilities_key(), "cached-marker", time.time())
    monkeypatch.setenv("GPUANAT_NO_CAPABILITIES_CACHE", "1")
    assert probe_capabilities().torch_version == real


def test_the_key_follows_what_the_answer_depends_on(monkeypatch, tmp_path):
    base = capabilities_key()
    assert capabilities_key() == base  # stable
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))  # another place packages may come from
    assert capabilities_key() != base
    monkeypatch.delenv("PYTHONPATH")
    # a package installed where there was none: a fake bitsandbytes on the path changes the key
    fake = tmp_path / "site"
    (fake / "bitsandbytes").mkdir(parents=True)
    (fake / "bitsandbytes" / "__init__.py").write_text("")
    monkeypatch.syspath_prepend(str(fake))
    assert capabilities_key(dict(os.environ)) != base
