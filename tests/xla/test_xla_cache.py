"""Persistent compilation cache: switch, and hit/miss detection in compile reports."""

import os

import jax
import jax.numpy as jnp
import pytest

from layoutlab.xla import compilation_cache, compile_report, enable_compilation_cache
from layoutlab.xla.cache import compilation_cache_dir, disable_compilation_cache

X = jax.ShapeDtypeStruct((8,), jnp.float32)


def make_fn():
    # A fresh function object each time, so jax's in-process cache cannot serve it and the
    # compile has to go to XLA or the persistent cache.
    def cached_fn(x):
        return jnp.sin(x) * jnp.float32(3.0)

    return cached_fn


def test_second_compile_is_a_persistent_cache_hit(tmp_path):
    before = compilation_cache_dir()
    with compilation_cache(tmp_path / "cache") as path:
        assert compilation_cache_dir() == path
        first = compile_report(make_fn(), X)
        second = compile_report(make_fn(), X)
        # jax's entry files; with a size limit (the suite sets one) it keeps an access-time
        # file beside each and a lock file too.
        entries = [name for name in os.listdir(path) if name.endswith("-cache")]
    assert (first.cache_hit, first.in_memory_cache_hit) == (False, False)
    assert (second.cache_hit, second.in_memory_cache_hit) == (True, False)
    assert len(entries) == 1
    assert compilation_cache_dir() == before


def test_no_cache_and_in_memory_reuse(tmp_path):
    # The suite runs with a persistent cache (tests/conftest.py): turned off inside a block
    # that puts the suite's settings back when it ends.
    with compilation_cache(tmp_path / "unused"):
        disable_compilation_cache()
        assert compilation_cache_dir() is None
        fn = make_fn()
        compile_report(fn, X)
        again = compile_report(fn, X)
    assert again.cache_hit is None
    assert again.in_memory_cache_hit is True
    assert "reused in-process: yes" in again.summary()


def test_enable_rejects_a_file_path(tmp_path):
    f = tmp_path / "file"
    f.write_text("x")
    with pytest.raises(ValueError, match="not a directory"):
        enable_compilation_cache(f)
