"""``attnlab bench --contention``: the busy process starts, spins on its core, and is always cleaned up;
every timed row gets its contended median and slowdown ratio. No timing is asserted."""
import json
import math
import os
import time

import pytest

from attnlab.bench.contention import BusyProcess, _cpu_s, add_slowdowns, busy_core
from attnlab.cli import main


def _gone(pid: int) -> bool:
    """True once ``pid`` no longer exists (a reaped child leaves no /proc entry)."""
    return not os.path.exists(f"/proc/{pid}")


def test_busy_process_spins_pinned_and_is_killed():
    with BusyProcess(bound_s=60) as busy:
        pid = busy.pid
        assert not _gone(pid)
        if hasattr(os, "sched_getaffinity"):
            assert os.sched_getaffinity(pid) == {busy.core}
        deadline = time.monotonic() + 30                  # on a loaded machine it may take a while to get CPU
        while (_cpu_s(pid) or 0.0) < 0.05 and _cpu_s(pid) is not None and time.monotonic() < deadline:
            time.sleep(0.05)
    assert busy.alive_at_end is True
    assert _gone(pid), "the busy process must be killed and reaped when the block ends"
    rep = busy.report()
    assert rep["core"] == busy_core() and rep["wall_s"] > 0
    if rep["cpu_s"] is not None:                      # /proc readable: it really burned CPU
        assert rep["cpu_s"] > 0.0


def test_busy_process_is_cleaned_up_when_the_block_raises():
    with pytest.raises(KeyError):
        with BusyProcess(bound_s=60) as busy:
            pid = busy.pid
            raise KeyError("boom")
    assert _gone(pid)


def test_busy_process_stops_by_itself_at_its_bound():
    """The hard bound: the child exits on its own deadline, even if nobody kills it."""
    busy = BusyProcess(bound_s=0.5)
    busy.__enter__()
    try:
        busy.proc.wait(timeout=20)
        assert busy.proc.returncode == 0
    finally:
        busy.stop()


def test_a_busy_process_that_ended_early_gives_no_ratio():
    with BusyProcess(bound_s=0.2) as busy:
        time.sleep(1.0)
    assert busy.alive_at_end is False
    rows = [dict(contestant="x", median_ms=2.0, notes=[])]
    add_slowdowns(rows, [[0.004, 0.005]], busy)
    assert "slowdown_busy" not in rows[0] and "busy process ended" in rows[0]["notes"][0]


def test_bad_bound():
    with pytest.raises(ValueError, match=r"bound_s=0.*positive time bound"):
        BusyProcess(bound_s=0)


def test_contention_through_cli_composes_with_the_kernel_options(tmp_path, capsys):
    path = tmp_path / "kernels.json"
    before = set(os.listdir("/proc")) if os.path.isdir("/proc") else set()
    rc = main(["bench", "--contention", "--n", "64", "--mask", "causal", "window", "--mode", "fwd", "fwdbwd",
               "--dtype", "float32", "--backend", "sdpa", "tiled", "--repeats", "1", "--no-flex", "--no-memory",
               "--heads", "2", "--head-dim", "16", "--json", str(path)])
    assert rc == 0
    report = json.loads(path.read_text())
    assert report["meta"]["config"]["contention"] is True
    rows = report["results"]
    assert {r["contestant"] for r in rows} == {"torch-sdpa", "sdpa", "tiled"} and len(rows) == 2 * 2 * 3
    pids = set()
    for r in rows:
        assert r["status"] == "ok", r
        assert math.isfinite(r["slowdown_busy"]) and r["slowdown_busy"] > 0, r
        assert r["median_ms_busy"] > 0 and len(r["times_ms_busy"]) == 1
        assert r["busy"]["alive_at_end"] is True
        pids.add(r["busy"]["pid"])
    assert len(pids) == 4, "one busy process per case"
    assert all(_gone(p) for p in pids), "every busy process is gone after the bench"
    if before:
        assert not {p for p in pids if str(p) in set(os.listdir("/proc")) - before}
    out = capsys.readouterr().out
    assert "x busy" in out and "busy ms" in out and "busy process spun on core" in out


def test_table_without_contention_has_no_busy_columns(tmp_path, capsys):
    rc = main(["bench", "--n", "64", "--mask", "causal", "--mode", "fwd", "--dtype", "float32", "--backend", "sdpa",
               "--repeats", "1", "--no-flex", "--no-memory", "--heads", "2", "--head-dim", "16",
               "--json", str(tmp_path / "k.json")])
    assert rc == 0
    assert "x busy" not in capsys.readouterr().out


def test_contention_refused_with_another_bench(capsys):
    assert main(["bench", "--contention", "--complexity", "--quick"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("attnlab: error: --contention") and "--complexity" in err
