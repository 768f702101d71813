"""Local Pythia-style language-model training runs, with checkpoints on Pythia's schedule.

The paper follows coupling through the training of Pythia (GPT-NeoX) checkpoints. Offline and
on a CPU we train the same architecture (``GPTNeoXForCausalLM``: rotary embeddings on a quarter
of each head, parallel attention+MLP residual, untied embeddings) at a tiny size on the
Shakespeare corpus (:mod:`coupling_utils.models.corpus`), saving checkpoints at Pythia's steps
(0, 1, 2, 4, ..., 512, then evenly spaced to the end). A run directory looks like::

    <run>/config.json, model.safetensors, tokenizer files   # the final checkpoint
    <run>/revisions/step<N>/                                # every checkpoint (save_pretrained)
    <run>/losses.csv, losses.parquet                        # train/val loss, val accuracy per checkpoint

so ``load_model(run, revision="step512")`` finds ``<run>/revisions/step512/``. Everything is
seeded (initialisation and data order), so the same spec gives the same weights on a CPU.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from coupling_utils.files import read_parquet, write_parquet
from coupling_utils.models.corpus import tokenized_corpus
from coupling_utils.schemas import Schema, check_table

LOSS_COLUMNS = [
    "step",
    "tokens",
    "train_loss",
    "val_loss",
    "val_acc",
    "train_loss_running",
    "unigram_entropy",
    "lr",
    "elapsed_s",
]
#: a run's per-checkpoint loss table (losses.parquet, :func:`load_losses`)
LOSSES = Schema("losses", dict.fromkeys(LOSS_COLUMNS, "number"), fix="pass a run's loss table (load_losses)")


@dataclass(frozen=True)
class LMSpec:
    """Everything that defines one training run (its hash names the cache entry)."""

    d_model: int = 128
    n_layers: int = 4
    n_heads: int = 4
    d_ff: int | None = None  # default 4 * d_model
    seq_len: int = 128
    batch_size: int = 16
    steps: int = 1000
    lr: float = 2e-3
    warmup: int = 50
    min_lr_ratio: float = 0.1
    weight_decay: float = 0.01
    vocab_size: int = 2048
    seed: int = 0
    # "pythia": saved checkpoints on Pythia's schedule; "final": only the end; "curve": only the end
    # saved, but the loss evaluated at step 0 and n_linear evenly spaced steps (the learning curve)
    checkpoints: str = "pythia"
    n_linear: int = 8  # evenly spaced checkpoints after step 512 ("pythia"), or evaluations ("curve")
    eval_windows: int = 64  # fixed validation (and train) windows of seq_len tokens
    # torch threads while training. One: at these sizes a second thread gave no measurable speed-up
    # on a 2-core CPU (0.51 s/step with two vs 0.55 CPU-s/step with one) yet doubled the CPU time,
    # and on a busy machine two threads spin-wait and run several times slower.
    threads: int = 1
    # the data amount: train on the first ``train_tokens`` tokens of the training split only
    # (None: all of it, about 1.6 M tokens at vocab 2048). Fewer tokens repeat as epochs.
    train_tokens: int | None = None

    def __post_init__(self):
        if self.train_tokens is not None and self.train_tokens < self.seq_len + 2:
            raise ValueError(
                f"train_tokens={self.train_tokens} is shorter than one training window "
                f"(seq_len + 2 = {self.seq_len + 2}); pass None for the whole training split"
            )

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        for (
            name,
            default,
        ) in _OPTIONAL_DEFAULTS.items():  # absent at their default: older specs keep their hash
            if d[name] == default:
                del d[name]
        return d


# Fields added after runs were cached: left out of ``LMSpec.to_dict`` at these values, so the
# specs that do not use them keep their cache keys.
_OPTIONAL_DEFAULTS = {"train_tokens": None}


def pythia_schedule(steps: int, n_linear: int = 8) -> list[int]:
    """Checkpoint steps: 0, then powers of two up to 512 (or ``steps``), then ``n_linear`` evenly
    spaced steps from 512 to ``steps`` (Pythia: 0, 1, 2, ..., 512, then every 1000 to 143000)."""
    if steps < 0:
        raise ValueError(f"steps must be >= 0, got {steps}")
    out = [0]
    p = 1
    while p <= min(512, steps):
        out.append(p)
        p *= 2
    if steps > 512:
        out += [512 + round((steps - 512) * i / n_linear) for i in range(1, n_linear + 1)]
    out.append(steps)
    return sorted(set(out))


CHECKPOINTS = ("pythia", "final", "curve")


def saved_steps(spec) -> list[int]:
    """The steps at which a run is evaluated (and, for "pythia", saved), from ``spec.checkpoints``.

    "pythia": :func:`pythia_schedule`; "final": the last step; "curve": step 0 and ``n_linear``
    evenly spaced steps up to the last, so the learning curve shows whether the loss flattened.
    """
    if spec.checkpoints == "pythia":
        return pythia_schedule(spec.steps, spec.n_linear)
    if spec.checkpoints == "curve":
        if spec.n_linear < 1:
            raise ValueError(f"checkpoints='curve' needs n_linear >= 1 evaluations, got {spec.n_linear}")
        return sorted({0, *(round(spec.steps * i / spec.n_linear) for i in range(1, spec.n_linear + 1))})
    if spec.checkpoints == "final":
        return [spec.steps]
    raise ValueError(f"checkpoints must be one of {CHECKPOINTS}, got {spec.checkpoints!r}")


def revision_steps(spec) -> list[int]:
    """The steps a run keeps as checkpoints (``revisions/step<N>/``): every :func:`saved_steps`
    step on the "pythia" schedule, none on the others (they keep only the final model). What the
    trainers save and what :func:`coupling_utils.models.zoo.planned_revisions` predicts, so a
    run's checkpoints are known before it is trained."""
    return saved_steps(spec) if spec.checkpoints == "pythia" else []


def n_parameters(spec: LMSpec) -> int:
    """The parameter count of the model ``spec`` trains (what :func:`count_parameters` gives).

    GPT-NeoX with untied embeddings: input and output embeddings (2·V·d), per block two layer
    norms (4d), the fused QKV projection (3d² + 3d), the attention output (d² + d) and the MLP
    (2·d·d_ff + d_ff + d), and the final layer norm (2d). Lets a family fix the tokens per
    parameter before any model is built.
    """
    d, ff, V = spec.d_model, spec.d_ff or 4 * spec.d_model, spec.vocab_size
    block = 4 * d + (3 * d * d + 3 * d) + (d * d + d) + (2 * d * ff + ff + d)
    return 2 * V * d + spec.n_layers * block + 2 * d


def gpt_neox_config(spec: LMSpec, tokenizer):
    """The Pythia-architecture config for ``spec`` (GPT-NeoX, rotary_pct=0.25, parallel residual)."""
    from transformers import GPTNeoXConfig

    if spec.d_model % spec.n_heads:
        raise ValueError(f"d_model={spec.d_model} is not divisible by n_heads={spec.n_heads}")
    eos = tokenizer.eos_token_id
    return GPTNeoXConfig(
        vocab_size=spec.vocab_size,
        hidden_size=spec.d_model,
        num_hidden_layers=spec.n_layers,
        num_attention_heads=spec.n_heads,
        intermediate_size=spec.d_ff or 4 * spec.d_model,
        hidden_act="gelu",
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25},
        attention_dropout=0.0,
        hidden_dropout=0.0,
        max_position_embeddings=max(512, spec.seq_len),
        initializer_range=0.02,
        layer_norm_eps=1e-5,
        use_cache=True,
        bos_token_id=eos,
        eos_token_id=eos,
        pad_token_id=eos,
        tie_word_embeddings=False,
        use_parallel_residual=True,
    )


def _eval_windows(ids: np.ndarray, seq_len: int, n: int) -> torch.Tensor:
    """``n`` fixed windows of ``seq_len + 1`` tokens, evenly spaced over ``ids``: [n, seq_len+1]."""
    span = seq_len + 1
    starts = np.linspace(0, len(ids) - span, n).astype(np.int64)
    return torch.from_numpy(np.stack([ids[s : s + span] for s in starts]).astype(np.int64))


@torch.no_grad()
def evaluate_lm(model, windows: torch.Tensor, batch_size: int = 32) -> tuple[float, float]:
    """Mean next-token cross-entropy (nats) and top-1 accuracy over all positions of ``windows``."""
    was_training = model.training
    model.eval()
    loss_sum, correct, count = 0.0, 0, 0
    for i in range(0, len(windows), batch_size):
        w = windows[i : i + batch_size]
        logits = model(input_ids=w[:, :-1]).logits
        target = w[:, 1:]
        loss_sum += torch.nn.functional.cross_entropy(
            logits.reshape(-1, logits.shape[-1]), target.reshape(-1), reduction="sum"
        ).item()
        correct += (logits.argmax(-1) == target).sum().item()
        count += target.numel()
    model.train(was_training)
    return loss_sum / count, correct / count


def learning_rate(step: int, spec) -> float:
    """The learning rate at a step: linear warm-up, then cosine decay to ``min_lr_ratio * lr``.

    Pythia's shape; used by the LM and the ViT runs.
    """
    if step < spec.warmup:
        return spec.lr * (step + 1) / spec.warmup
    t = (step - spec.warmup) / max(1, spec.steps - spec.warmup)
    return spec.lr * (spec.min_lr_ratio + (1 - spec.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * t)))


def count_parameters(model, *, non_embedding: bool = False) -> int:
    n = sum(p.numel() for p in model.parameters())
    if non_embedding:
        n -= model.get_input_embeddings().weight.numel() + model.get_output_embeddings().weight.numel()
    return n


def optimizer_step(
    model: torch.nn.Module, opt: torch.optim.Optimizer, loss: torch.Tensor, *, step: int, lr: float, what: str
) -> float:
    """One clipped optimisation step (shared by the LM and ViT runs); fails clearly on a NaN loss."""
    if not torch.isfinite(loss):
        raise FloatingPointError(
            f"{what} loss became {loss.item()} at step {step}; lower the learning rate (lr={lr})"
        )
    opt.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    return loss.item()


@contextlib.contextmanager
def torch_threads(n: int) -> Iterator[None]:
    """Train on ``n`` torch threads, then restore the caller's setting."""
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def adamw(model: torch.nn.Module, *, lr: float, weight_decay: float, betas: tuple[float, float]):
    """AdamW with weight decay on weight matrices only (not on biases and norm scales)."""
    decay = [p for p in model.parameters() if p.ndim >= 2]
    no_decay = [p for p in model.parameters() if p.ndim < 2]
    return torch.optim.AdamW(
        [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=lr,
        betas=betas,
        eps=1e-8,
    )


def train_steps(
    model: torch.nn.Module,
    opt: torch.optim.Optimizer,
    spec,
    *,
    loss_at: Callable[[int], torch.Tensor],
    checkpoint: Callable[[int, float], str],
    progress: bool,
    desc: str,
    what: str,
) -> list[int]:
    """The loop the LM and ViT runs share; returns the checkpoint steps.

    ``spec`` has steps, lr, warmup, min_lr_ratio, checkpoints (see :func:`saved_steps`) and
    n_linear.
    Each step sets the warm-up/cosine learning rate, takes ``loss_at(step)`` (the batch loss) and
    one clipped optimiser step; at every checkpoint step ``checkpoint(step, mean running loss)``
    saves and evaluates, returning a short text for the progress bar.
    """
    from tqdm.auto import tqdm

    schedule = saved_steps(spec)
    running: list[float] = []

    def save(step: int) -> str:
        note = checkpoint(step, float(np.mean(running)) if running else float("nan"))
        running.clear()
        return note

    bar = tqdm(total=spec.steps, desc=desc, disable=not progress, leave=False)
    if 0 in schedule and spec.steps > 0:
        save(0)
    for step in range(1, spec.steps + 1):
        for g in opt.param_groups:
            g["lr"] = learning_rate(step - 1, spec)
        running.append(optimizer_step(model, opt, loss_at(step), step=step, lr=spec.lr, what=what))
        bar.update(1)
        if step in schedule:
            bar.set_postfix_str(save(step))
    bar.close()
    if spec.steps == 0:
        save(0)
    return schedule


def train_lm(spec: LMSpec, out_dir: str | Path, *, progress: bool = True, desc: str | None = None) -> dict:
    """Train one GPT-NeoX model per ``spec`` into ``out_dir`` (see the module doc for the layout).

    Returns the final metrics (val_loss, val_acc, unigram_entropy, n_params, seconds, ...).
    """
    from transformers import GPTNeoXForCausalLM

    t0, c0 = time.perf_counter(), time.process_time()
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    with torch_threads(spec.threads):
        corpus = tokenized_corpus(spec.vocab_size)
        tok = corpus.tokenizer
        config = gpt_neox_config(spec, tok)
        torch.manual_seed(spec.seed)
        model = GPTNeoXForCausalLM(config)
        model.train()
        opt = adamw(model, lr=spec.lr, weight_decay=spec.weight_decay, betas=(0.9, 0.95))
        gen = torch.Generator().manual_seed(spec.seed + 1_000_003)
        train_ids = torch.from_numpy(corpus.train_ids[: spec.train_tokens].astype(np.int64))
        val_w = _eval_windows(corpus.val_ids, spec.seq_len, spec.eval_windows)
        train_w = _eval_windows(corpus.train_ids[: spec.train_tokens], spec.seq_len, spec.eval_windows)
        unigram = corpus.unigram_entropy()
        offsets = torch.arange(spec.seq_len + 1)
        rows = []

        def loss_at(step: int) -> torch.Tensor:
            starts = torch.randint(0, len(train_ids) - spec.seq_len - 1, (spec.batch_size,), generator=gen)
            batch = train_ids[starts[:, None] + offsets]
            logits = model(input_ids=batch[:, :-1]).logits
            return torch.nn.functional.cross_entropy(
                logits.reshape(-1, logits.shape[-1]), batch[:, 1:].reshape(-1)
            )

        def checkpoint(step: int, running_loss: float) -> str:
            val_loss, val_acc = evaluate_lm(model, val_w)
            train_loss, _ = evaluate_lm(model, train_w)
            losses = {"train_loss": train_loss, "val_loss": val_loss, "val_acc": val_acc}
            rows.append(
                {"step": step, "tokens": step * spec.batch_size * spec.seq_len, **losses}
                | {"train_loss_running": running_loss, "unigram_entropy": unigram}
                | {"lr": learning_rate(max(step - 1, 0), spec), "elapsed_s": time.perf_counter() - t0}
            )
            for target in checkpoint_targets(out_dir, step, spec):
                model.save_pretrained(target)
                tok.save_pretrained(target)
            return f"val_loss={val_loss:.3f}"

        train_steps(
            model,
            opt,
            spec,
            loss_at=loss_at,
            checkpoint=checkpoint,
            progress=progress,
            desc=desc or "train",
            what="training",
        )
        _write_lm_run(out_dir, rows, spec, corpus)
        return _lm_metrics(rows[-1], model, spec, unigram, (t0, c0))


def checkpoint_targets(out_dir: Path, step: int, spec) -> list[Path]:
    """Where a run saves the model at ``step``: each of :func:`revision_steps` as a revision
    ("pythia": every checkpoint, the final step too, like Pythia's step143000), and the final model."""
    targets = [out_dir / "revisions" / f"step{step}"] if step in revision_steps(spec) else []
    if step == spec.steps:
        targets.append(out_dir)
    return targets


def _write_lm_run(out_dir: Path, rows: list[dict], spec: LMSpec, corpus) -> None:
    """The run's loss curve (``losses.csv`` and ``.parquet``) and ``training_spec.json``."""
    losses = pd.DataFrame(rows, columns=LOSS_COLUMNS)
    losses.to_csv(out_dir / "losses.csv", index=False)
    write_parquet(losses, out_dir / "losses.parquet")
    (out_dir / "training_spec.json").write_text(
        json.dumps(
            {
                "spec": spec.to_dict(),
                "corpus": corpus.describe(),
                "checkpoints": [f"step{s}" for s in revision_steps(spec)],
            },
            indent=2,
        )
    )


def _lm_metrics(final: dict, model, spec: LMSpec, unigram: float, started: tuple[float, float]) -> dict:
    """A finished run's final metrics; ``started``: (perf_counter, process_time) at its start."""
    t0, c0 = started
    return {
        "val_loss": final["val_loss"],
        "val_acc": final["val_acc"],
        "train_loss": final["train_loss"],
        "unigram_entropy": unigram,
        "val_loss_below_unigram": unigram - final["val_loss"],
        "n_params": count_parameters(model),
        "n_params_non_embedding": count_parameters(model, non_embedding=True),
        "n_layers": spec.n_layers,
        "d_model": spec.d_model,
        "steps": spec.steps,
        "seed": spec.seed,
        "tokens": spec.steps * spec.batch_size * spec.seq_len,
        "train_seconds": time.perf_counter() - t0,
        "cpu_seconds": time.process_time() - c0,
    }


def val_loss_plateau(losses: pd.DataFrame, *, last: float = 0.25, column: str = "val_loss") -> dict:
    """How much the loss still fell over exactly the last ``last`` fraction of training (has it
    flattened?).

    ``losses``: a run's per-checkpoint table (:func:`load_losses`). The window starts at step
    ``(1 - last) * final_step``, its loss there interpolated linearly between the checkpoints on
    either side, so that it is the stated fraction whatever the checkpoints' spacing (the nearest
    checkpoint would shorten or lengthen it, and a verdict near a threshold would hang on that
    rounding). Compared with the lowest loss measured after it: ``drop`` (nats) and
    ``relative_drop`` (drop / the loss at the start); chapter f03 states the threshold. Returns
    {from_step, to_step, between, from_loss, best_loss, drop, relative_drop}, ``between`` the two
    checkpoints interpolated between (the same step twice where one lies at the start).
    """
    if not 0 < last < 1:
        raise ValueError(f"last must be a fraction of training in (0, 1), got {last}")
    check_table(losses, LOSSES.need("step", column))
    curve = losses.sort_values("step")
    steps, values = curve["step"].to_numpy(dtype=float), curve[column].to_numpy(dtype=float)
    final_step = int(steps[-1])
    if final_step <= 0 or len(curve) < 2:
        raise ValueError("need at least two checkpoints, the last after step 0, to judge a plateau")
    start = (1 - last) * final_step
    if start < steps[0]:
        raise ValueError(
            f"the first checkpoint (step {int(steps[0])}) comes after the start of the last {last:.0%} of "
            f"training (step {start:g}): no loss to interpolate there"
        )
    below, above = steps[steps <= start].max(), steps[steps >= start].min()
    before = float(np.interp(start, steps, values))
    best = min(before, float(values[steps > start].min()))
    return {
        "from_step": int(start) if float(start).is_integer() else start,
        "to_step": final_step,
        "between": (int(below), int(above)),
        "from_loss": before,
        "best_loss": best,
        "drop": before - best,
        "relative_drop": (before - best) / before,
    }


def load_losses(run_dir: str | Path) -> pd.DataFrame:
    """The per-checkpoint loss table of a run directory."""
    run_dir = Path(run_dir)
    return read_parquet(run_dir / "losses.parquet")


def list_revisions(run_dir: str | Path) -> list[str]:
    """Checkpoint names (``step<N>``) in a run directory, in step order."""
    rev = Path(run_dir) / "revisions"
    if not rev.is_dir():
        return []
    names = [p.name for p in rev.iterdir() if p.is_dir() and (p / "config.json").exists()]
    return sorted(
        names, key=lambda n: (int(n[4:]) if n.startswith("step") and n[4:].isdigit() else 1 << 60, n)
    )
