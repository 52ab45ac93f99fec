"""``attnlab bench --ring``: the ring and one process compute the same attention, and the report says so."""
import pytest

from attnlab.bench.ring import RingBenchConfig, format_ring, run_ring


def test_ring_bench_runs_and_agrees_with_one_process():
    rep = run_ring(RingBenchConfig(n=256, heads=2, dim=16, repeats=1), argv=["bench", "--ring"])
    assert rep["max_abs_diff"] < 1e-5                        # the ring's output is the single process's
    assert len(rep["ring"]["times_ms"]) == len(rep["one_process"]["times_ms"]) == 1
    assert len(rep["ring"]["rank_times_ms"]) == 2
    assert rep["ring"]["median_ms"] > 0 and rep["x_one_process"] > 0
    text = format_ring(rep)
    assert "ring, 2 ranks" in text and "x one process" in text


@pytest.mark.parametrize("kw, match", [(dict(ranks=1), "--ring-ranks 1"), (dict(n=255), "255"),
                                       (dict(repeats=0), "--repeats 0")])
def test_ring_bench_refuses_bad_settings(kw, match):
    with pytest.raises(ValueError, match=match):
        run_ring(RingBenchConfig(**kw))
