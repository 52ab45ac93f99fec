"""What `attnlab train` refuses before doing any work: sizes that cannot fit in memory (new runs and checkpoints
alike), option values no run can use (leaving no directory behind), and a checkpoint whose tensor file is not
safetensors. The memory check is asserted by forbidding the allocation path, never by timing."""
from __future__ import annotations

import json

import pytest

from attnlab.cli import main
from attnlab.models import GPT
from attnlab.models.seq2seq import Seq2Seq
from attnlab.tasks import get_spec
from attnlab.train import CheckpointError, load_checkpoint, sizes
from attnlab.train import checkpoint as ckpt_mod
from attnlab.train.sizes import SizeError, check_fits, model_params

TEXT = "".join(f"line {i}: the cat sat on mat number {i * 7 % 13}.\n" for i in range(120))
TRAIN = ["--preset", "nano", "--max-len", "16", "--batch-size", "4", "--steps", "2", "--warmup", "1",
         "--eval-iters", "1", "--eval-interval", "2", "--no-progress"]
QUICK = ["--steps", "1", "--eval-iters", "1", "--batch-size", "4", "--no-progress"]     # any task, briefly


@pytest.fixture
def machine(monkeypatch):
    """A machine with 8 GiB available, whatever this one has; building any model is an error."""
    monkeypatch.setattr(sizes, "available_ram", lambda: 8 * 2 ** 30)

    def never(*args, **kwargs):
        raise AssertionError("a model was built (allocated) for a size that should have been refused")

    for cls in (GPT, Seq2Seq):
        monkeypatch.setattr(cls, "__init__", never)


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    root = tmp_path_factory.mktemp("limits")
    (root / "text.txt").write_text(TEXT)
    assert main(["train", "gpt", "--data", str(root / "text.txt"), "--out", str(root / "run"), *TRAIN]) == 0
    return root / "run"


def rewrite_checkpoint(ckpt_dir, change) -> None:
    """Edit a checkpoint's checkpoint.json with ``change(meta)`` and re-hash it: hashes match, content is bad."""
    path = ckpt_dir / ckpt_mod.META_FILE
    meta = json.loads(path.read_text())
    meta.pop("meta_sha256")
    change(meta)
    meta["meta_sha256"] = ckpt_mod._sha256(json.dumps(meta, sort_keys=True).encode())
    path.write_text(json.dumps(meta, indent=1, sort_keys=True))


def error_lines(err: str) -> list[str]:
    return [line for line in err.splitlines() if line.startswith("attnlab: error:")]


# ------------------------------------------------------------------ sizes
@pytest.mark.parametrize("argv, fix", [
    (["gpt", "--preset", "nano", "--batch-size", "1000000000"], "lower --batch-size or --max-len"),
    (["seq2seq", "--max-len", "10000000"], "lower --batch-size or --max-len"),
])
def test_a_training_step_too_big_for_memory_is_refused_before_allocation(tmp_path, monkeypatch, capsys, machine,
                                                                         argv, fix):
    (tmp_path / "text.txt").write_text(TEXT)
    monkeypatch.chdir(tmp_path)
    data = ["--data", "text.txt"] if argv[0] == "gpt" else []
    assert main(["train", *argv, *data, "--steps", "2", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert len(error_lines(err)) == 1 and "Traceback" not in err, err
    assert "of memory" in err and "8.59 GB is available" in err and err.rstrip().endswith(fix), err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["text.txt"]            # no run directory


def test_a_bpe_vocabulary_past_the_bound_is_refused_before_the_tokenizer_runs(tmp_path, monkeypatch, capsys):
    from attnlab.data.tokenization import BPETokenizer

    def never(*args, **kwargs):
        raise AssertionError("the tokenizer was trained (10**9 entries abort the process)")

    monkeypatch.setattr(BPETokenizer, "train", never)
    monkeypatch.chdir(tmp_path)
    assert main(["train", "gpt", "--tokenizer", "bpe", "--vocab-size", "1000000000", *QUICK]) == 2
    assert error_lines(capsys.readouterr().err) == [
        "attnlab: error: --vocab-size must be from 256 (the byte alphabet) to 1,000,000, got 1,000,000,000"]
    assert list(tmp_path.iterdir()) == []


def test_a_checkpoint_describing_a_huge_model_is_refused_by_every_reader(run, tmp_path, capsys, machine):
    import shutil
    edited = tmp_path / "run"
    shutil.copytree(run, edited)
    ckpt = edited / "step-000002"
    rewrite_checkpoint(ckpt, lambda meta: meta["model_config"].update(n_layers=10 ** 7))
    with pytest.raises(CheckpointError, match=r"checkpoint.json needs about .* of memory .*n_layers=10000000.*"
                                              r"cannot be loaded here"):
        load_checkpoint(edited)
    for argv in (["eval", str(edited)], ["generate", str(edited), "--prompt", "line", "--max-new-tokens", "2"],
                 ["train", "gpt", "--out", str(edited), "--resume", "--steps", "4", "--no-progress"]):
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert len(error_lines(err)) == 1 and "cannot be loaded here" in err and "Traceback" not in err, err


def test_the_parameter_estimate_matches_every_model_kind():
    from attnlab.data.pairs import PairTaskConfig
    from attnlab.tasks.captioner import default_config
    from attnlab.tasks.code_models import CodeLSTM, CodeLSTMConfig
    from attnlab.tasks.evoformer import EvoformerTask
    from attnlab.models import GPTConfig
    from attnlab.models.seq2seq import Seq2SeqConfig
    from attnlab.models.vit import ViT, ViTConfig
    from attnlab.models.captioner import Captioner
    from attnlab.models.evoformer import EvoformerConfig
    from attnlab.models.msa import MSAConfig, MSATransformer
    pairs = PairTaskConfig()
    flat = EvoformerConfig(kind="flat", vocab=pairs.n_symbols, max_rows=pairs.rows, max_cols=pairs.cols)
    models = [GPT(GPTConfig.preset("nano", vocab_size=100)), GPT(GPTConfig(vocab_size=300, positional="rope",
                                                                           tie_weights=False, n_layers=1)),
              Seq2Seq(Seq2SeqConfig.preset("tiny", vocab_size=19)), ViT(ViTConfig.preset("digits")),
              Captioner(default_config()), CodeLSTM(CodeLSTMConfig(vocab_size=300, hidden=40)),
              EvoformerTask(pairs).build_model(), EvoformerTask(pairs, flat).build_model(),
              MSATransformer(MSAConfig(n_layers=2)), MSATransformer(MSAConfig(row="mean", dim=32))]
    for m in models:
        actual = sum(p.numel() for p in m.parameters())
        est = model_params(m.cfg.to_dict())
        assert 0.85 * actual <= est <= 1.15 * actual, f"{type(m).__name__}: estimate {est}, actual {actual}"
    assert model_params({"d": 4}) == 0 and model_params({"vocab_size": "x", "n_layers": 2}) == 0   # unknown: no check
    with pytest.raises(SizeError, match="needs about 1.07 GB of memory .* 537 MB is available; lower --x"):
        check_fits(2 ** 30, what="it", detail="d", fix="lower --x", available=2 ** 29)


# ------------------------------------------------------------------ a broken tensor file
def test_a_checkpoint_whose_safetensors_file_is_invalid_is_one_line(run, tmp_path, capsys):
    import shutil
    broken = tmp_path / "run"
    shutil.copytree(run, broken)
    ckpt = broken / "step-000002"
    junk = b"\x08\x00\x00\x00\x00\x00\x00\x00not json"                 # a header length, then no JSON header
    (ckpt / "model.safetensors").write_bytes(junk)
    rewrite_checkpoint(ckpt, lambda meta: meta["files"]["model.safetensors"].update(
        sha256=ckpt_mod._sha256(junk), bytes=len(junk)))
    with pytest.raises(CheckpointError, match="model.safetensors is not a valid safetensors file"):
        load_checkpoint(broken)
    assert main(["eval", str(broken)]) == 2
    err = capsys.readouterr().err
    assert len(error_lines(err)) == 1 and "not a valid safetensors file" in err and "Traceback" not in err, err


# ------------------------------------------------------------------ options
@pytest.mark.parametrize("argv, message", [
    (["vit", "--patch", "0"], "--patch must be >= 1, got 0"),
    (["vit", "--upsample", "0"], "--upsample must be >= 1"),
    (["vit", "--shift", "-1"], "--shift must be >= 0"),
    (["gpt", "--seed", str(2 ** 70)], "--seed must be an integer from 0 to 2**63 - 1"),
    (["gpt", "--seed", "-1"], "--seed must be an integer from 0 to 2**63 - 1"),
    (["gpt", "--max-len", "0"], "--max-len must be >= 1"),
    (["gpt", "--dropout", "1.5"], "--dropout must be a probability"),
    (["gpt", "--lr", "1e-6"], "--lr"),
    (["gpt", "--data", "missing.txt"], "missing.txt"),
    (["seq2seq", "--layers", "0"], "--layers must be >= 1"),
    (["seq2seq", "--eval-examples", "0"], "--eval-examples must be >= 1"),
    (["captioner", "--vit-layers", "0"], "--vit-layers must be >= 1"),
    (["vqa", "--scene-seed", "-2"], "--scene-seed must be an integer"),
    (["evoformer", "--rows", "0"], "--rows must be >= 1"),
    (["code", "--corpus-bytes", "0"], "--corpus-bytes must be >= 1"),
    (["gpt", "--dist-timeout", "0"], "--dist-timeout must be a positive number"),
])
def test_a_rejected_option_leaves_no_directory(tmp_path, monkeypatch, capsys, argv, message):
    monkeypatch.chdir(tmp_path)
    assert main(["train", *argv, *QUICK]) == 2
    err = capsys.readouterr().err
    assert len(error_lines(err)) == 1 and message in error_lines(err)[0] and "Traceback" not in err, err
    assert list(tmp_path.iterdir()) == [], f"{argv} left {list(tmp_path.rglob('*'))}"


def test_every_task_validates_its_options():
    for name in ("gpt", "seq2seq", "vit", "captioner", "vqa", "evoformer", "code"):
        assert get_spec(name).validate.__name__ != "<lambda>", f"{name} has no option checks"
