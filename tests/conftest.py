"""Session set-up shared by every test module.

``auto`` reads this machine's speed profile (``attnlab tune``; functional/profile.py) from the user's cache
directory. A developer who has tuned their machine would otherwise run the suite against their profile, and
tests that check auto's built-in rules would depend on it: every test process gets an empty cache directory
of its own (tests that need a profile write one there).

``auto`` also keeps its decisions per kind of request (functional/auto_memo.py). Tests that swap its rules
(a monkeypatched ``cpu_class`` or ``on_amx``) would otherwise meet a decision an earlier test kept: every
test starts with none kept.
"""
import os
import tempfile

import pytest

os.environ["ATTNLAB_CACHE_DIR"] = tempfile.mkdtemp(prefix="attnlab-test-cache-")


@pytest.fixture(autouse=True)
def _no_kept_decisions():
    from attnlab.functional import auto_memo
    auto_memo.forget()
    yield


@pytest.fixture
def tiles(monkeypatch):
    """The compiled kernel's AVX-512 tiles as an AVX512-BF16 build reports them (D and Dv multiples of 16), whatever
    this machine built: auto's rules for the Zen 4's class, testable on any CPU."""
    monkeypatch.setattr("attnlab.functional.auto_rule.on_tiles", lambda D, Dv: D % 16 == 0 and Dv % 16 == 0)
