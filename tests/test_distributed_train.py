"""attnlab.train.distributed: 2 gloo ranks equal one process on the same global batch; rank 0 alone writes;
torchrun's CLI path trains and resumes exactly; a dead or hung rank is a clear error on the survivor, not a hang."""
from __future__ import annotations

import json
import multiprocessing
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from attnlab.data import prepare_lm_data
from attnlab.models import GPTConfig
from attnlab.tasks.lm import LMTask
from attnlab.train import Trainer, TrainConfig, list_checkpoints, load_checkpoint
from attnlab.train.distributed import DistContext, DistributedError, free_port, init_distributed
from attnlab.train.rundir import LOCK_FILE

TEXT = "".join(f"line {i}: the cat sat on mat number {i * 7 % 13}.\n" for i in range(120))
# The same run as `attnlab train gpt` with these flags (tiny nano GPT, dropout 0: masks would differ per rank).
FLAGS = ["--preset", "nano", "--max-len", "16", "--batch-size", "4", "--grad-accum", "2", "--steps", "4",
         "--warmup", "2", "--eval-iters", "2", "--eval-interval", "2", "--checkpoint-interval", "2", "--dropout", "0"]
# A hang guard, not a speed bound: no test waits longer for its processes. Hitting it means a hang
# (a healthy run takes seconds); the assertions are on what happened, never on how long it took.
HANG_GUARD_S = 300


def configs(vocab_size: int, out) -> tuple[GPTConfig, TrainConfig]:
    mcfg = GPTConfig.preset("nano", vocab_size=vocab_size, max_len=16, dropout=0.0)
    cfg = TrainConfig.for_preset("nano", steps=4, batch_size=4, grad_accum=2, warmup_steps=2, eval_iters=2,
                                 eval_interval=2, checkpoint_interval=2, out_dir=str(out))
    return mcfg, cfg


def _rank_main(rank: int, world: int, port: int, corpus: str, out: str, fault: str, timeout_s: float) -> None:
    """One spawned rank: join the group as torchrun would, train, write 'ok' or the error to out/rank-N.txt."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world),
                      LOCAL_RANK=str(rank))
    torch.set_num_threads(1)
    dist = init_distributed(timeout_s=timeout_s)
    data = prepare_lm_data(corpus, "char")
    mcfg, cfg = configs(data.tokenizer.vocab_size, Path(out) / "run")
    trainer = Trainer(LMTask(mcfg, data), cfg, progress=False, dist=dist)
    real_step = trainer._train_step

    def faulty_step():
        if rank == 1 and trainer.step == 1 and fault == "dies":
            os._exit(3)
        if rank == 1 and trainer.step == 1 and fault == "hangs":
            time.sleep(10 * HANG_GUARD_S)                              # never wakes up: the test kills it
        return real_step()

    trainer._train_step = faulty_step
    try:
        trainer.train(plot=False)
        result = f"ok {type(trainer.metrics).__name__}"
    except DistributedError as e:
        result = f"DistributedError {e}"
    (Path(out) / f"rank-{rank}.txt").write_text(result)
    dist.shutdown()


def run_ranks(corpus: str, out: Path, *, fault: str = "none", timeout_s: float = 30.0, world: int = 2):
    """Spawn the ranks; returns ({rank: result text}, {rank: exit code when rank 0 ended}, {rank: exit code at
    the end}); None = still running (then killed).

    Waits for each rank at most HANG_GUARD_S; with fault="hangs", rank 1 gets 1 s after rank 0, then is killed.
    """
    ctx = multiprocessing.get_context("spawn")
    port = free_port()
    procs = [ctx.Process(target=_rank_main, args=(r, world, port, corpus, str(out), fault, timeout_s))
             for r in range(world)]
    for p in procs:
        p.start()
    try:
        procs[0].join(HANG_GUARD_S)
        ended = {r: p.exitcode for r, p in enumerate(procs)}        # the moment rank 0 ended (or the guard hit)
        for p in procs[1:]:
            p.join(1.0 if fault == "hangs" else HANG_GUARD_S)         # a hung rank never ends by itself
        final = {r: p.exitcode for r, p in enumerate(procs)}
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join(5)
    results = {r: (out / f"rank-{r}.txt").read_text() for r in range(world) if (out / f"rank-{r}.txt").exists()}
    return results, ended, final


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> str:
    f = tmp_path_factory.mktemp("corpus") / "text.txt"
    f.write_text(TEXT)
    return str(f)


@pytest.fixture(scope="module")
def ddp_run(corpus, tmp_path_factory) -> Path:
    """2 ranks, 4 steps of a global batch of 4 (2 rows per rank), 2 micro-batches per step."""
    out = tmp_path_factory.mktemp("ddp")
    results, *_ = run_ranks(corpus, out)
    assert results == {0: "ok MetricsLog", 1: "ok QuietLog"}, results
    return out / "run"


def params(run: Path) -> dict:
    return load_checkpoint(run).model_state


def test_two_ranks_equal_one_process_with_the_global_batch(corpus, ddp_run, tmp_path):
    data = prepare_lm_data(corpus, "char")
    mcfg, cfg = configs(data.tokenizer.vocab_size, tmp_path)
    single = Trainer(LMTask(mcfg, data), cfg, progress=False)
    losses = single.train(plot=False)
    ddp = params(ddp_run)
    for name, p in single.model.state_dict().items():
        diff = (ddp[name] - p).abs().max().item()
        # Adam divides by sqrt(v): a rounding difference in a near-zero gradient (the 2-rank sum vs one
        # backward) moves that weight by up to ~lr. Measured max diff 8.4e-6 after 4 steps; wrong shards: ~lr = 2e-3.
        torch.testing.assert_close(ddp[name], p, rtol=1e-4, atol=1e-4, msg=f"{name}: max diff {diff:.2e}")
    records = [json.loads(line) for line in (ddp_run / "metrics.jsonl").read_text().splitlines()]
    logged = [r["loss"] for r in records if "loss" in r]
    assert len(logged) == 4                                               # rank 1 wrote no second copy
    torch.testing.assert_close(torch.tensor(logged), torch.tensor(losses))  # the logged loss is the global mean


def test_only_rank_0_writes(ddp_run):
    written = sorted(p.name for p in ddp_run.iterdir() if p.name != LOCK_FILE)   # the run directory's lock aside
    assert written == ["metrics.jsonl", "step-000002", "step-000004"]
    steps = [line for line in (ddp_run / "metrics.jsonl").read_text().splitlines() if '"val_loss"' in line]
    assert len(steps) == 3                                                # evaluations at steps 0, 2, 4, once each


def _torchrun(args: list[str]) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", "--master_port", str(free_port()),
           "-m", "attnlab", "train", "gpt", *args, "--no-progress", "--dist-timeout", "30"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run(cmd, capture_output=True, text=True, timeout=HANG_GUARD_S, env=env)


def test_torchrun_cli_matches_and_resumes_exactly(corpus, ddp_run, tmp_path):
    out = tmp_path / "cli"
    done = _torchrun(["--data", corpus, *FLAGS, "--out", str(out)])
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.count("validation loss") == 1                      # rank 1 printed nothing
    whole = params(out)
    assert all(torch.equal(whole[k], v) for k, v in params(ddp_run).items())   # same run as the spawned ranks
    shutil.move(str(out / "step-000004"), str(tmp_path / "moved"))        # back to step 2, then resume
    done = _torchrun(["--resume", "--out", str(out), "--steps", "4"])
    assert done.returncode == 0, done.stderr[-3000:]
    assert "resuming" in done.stderr and load_checkpoint(out).step == 4
    for name, p in params(out).items():
        assert torch.equal(p, whole[name]), f"{name}: max diff {(p - whole[name]).abs().max():.2e}"


# What rank 0's error must name: gloo's own report of the cause, inside attnlab's DistributedError.
CAUSES = {"dies": r"Connection (reset|closed) by peer|Broken pipe|EOF|Socket closed",   # the peer's socket closed
          "hangs": r"Timed out waiting 4000ms"}                                          # our 4 s collective timeout


@pytest.mark.parametrize("fault", ["dies", "hangs"])
def test_a_failed_rank_is_a_clear_error_not_a_hang(corpus, tmp_path, fault):
    results, ended, final = run_ranks(corpus, tmp_path, fault=fault, timeout_s=4.0)
    assert ended[0] is not None, f"rank 0 still running after {HANG_GUARD_S} s: a hang"
    assert 0 in results, f"rank 0 exited ({ended[0]}) without writing its result"
    assert results[0].startswith("DistributedError rank 0 of 2 failed") and "another rank died or hung" in results[0]
    assert "collectives time out after 4 s" in results[0], results[0]
    assert re.search(CAUSES[fault], results[0]), results[0]
    if fault == "dies":       # rank 1 ended by its own fault (exit code 3), not killed by the test
        assert final[1] == 3, final
    else:                     # rank 1 was still hanging when rank 0 gave up: rank 0 did not wait for it
        assert ended[1] is None, ended
    assert 1 not in results
    assert list_checkpoints(tmp_path / "run") == []                      # it failed before the first checkpoint


def test_global_batch_must_split_evenly_and_sharding_is_disjoint(monkeypatch):
    ctx = [DistContext(rank=r, world_size=3) for r in range(3)]
    with pytest.raises(ValueError, match="batch_size 4 .* not divisible by the 3 processes; use a multiple of 3"):
        ctx[0].check_batch(4)
    x = torch.arange(6 * 5).view(6, 5)
    assert torch.equal(torch.cat([c.shard(x) for c in ctx]), x)           # the slices tile the global batch
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    assert init_distributed() == DistContext()                            # outside torchrun: one process, no group
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.delenv("MASTER_ADDR", raising=False)
    with pytest.raises(ValueError, match="WORLD_SIZE=2 but .*MASTER_ADDR.* launch with torchrun"):
        init_distributed()
