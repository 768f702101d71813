"""Prompts from the Open LLM Leaderboard's tasks (GSM8K, ARC, HellaSwag, MMLU, TruthfulQA,
Winogrande), formatted as the leaderboard shows them, through the ``datasets`` package.

An extension beyond the paper's prompt set: :func:`load_task_prompts` draws ``n_per_task``
records of each task with a seed and returns them as prompt records of the same shape as
:func:`coupling_utils.analysis.data.load_prompts`. Offline, or without ``datasets``, it fails
with :class:`TaskDataUnavailable` naming the dataset and how to get it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from coupling_utils.analysis.data import PROMPT_CATEGORIES, DataError

__all__ = ["TaskDataUnavailable", "TaskDataset", "TASK_DATASETS", "load_task_prompts"]


class TaskDataUnavailable(RuntimeError):
    """A task dataset could not be loaded through ``datasets`` (offline, not cached, renamed)."""


@dataclass(frozen=True)
class TaskDataset:
    """Where a prompt category's real task data lives, and how a record becomes a prompt."""

    path: str
    name: str | None
    split: str
    format: Callable[[Mapping], str]


def _choices_block(labels: Iterable[str], texts: Iterable[str]) -> str:
    return " ".join(f"{lab}) {txt}" for lab, txt in zip(labels, texts))


def _fmt_gsm8k(r: Mapping) -> str:
    return f"Question: {r['question']} Answer:"


def _fmt_arc(r: Mapping) -> str:
    ch = r["choices"]
    return f"Question: {r['question']} {_choices_block(ch['label'], ch['text'])} Answer:"


def _fmt_hellaswag(r: Mapping) -> str:
    return str(r["ctx"])


def _fmt_mmlu(r: Mapping) -> str:
    return f"Question: {r['question']} {_choices_block('ABCDEFGH', r['choices'])} Answer:"


def _fmt_truthfulqa(r: Mapping) -> str:
    return f"Q: {r['question']} A:"


def _fmt_winogrande(r: Mapping) -> str:
    return (
        f"Fill in the blank: {r['sentence']} Options: {r['option1']} or {r['option2']}. The blank refers to"
    )


# the paper's six datasets (Open LLM Leaderboard v1 tasks), by prompt category
TASK_DATASETS: dict[str, TaskDataset] = {
    "grade_school_math": TaskDataset("gsm8k", "main", "test", _fmt_gsm8k),
    "science_questions": TaskDataset("ai2_arc", "ARC-Challenge", "test", _fmt_arc),
    "commonsense_continuation": TaskDataset("hellaswag", None, "validation", _fmt_hellaswag),
    "academic_multiple_choice": TaskDataset("cais/mmlu", "all", "test", _fmt_mmlu),
    "truthfulness": TaskDataset("truthful_qa", "generation", "validation", _fmt_truthfulqa),
    "pronoun_resolution": TaskDataset("winogrande", "winogrande_xl", "validation", _fmt_winogrande),
}


def load_task_prompts(
    n_per_task: int, seed: int = 0, *, categories: Sequence[str] | None = None
) -> pd.DataFrame:
    """Prompts from the paper's six task datasets through Hugging Face ``datasets``.

    Same columns as :func:`load_prompts` (``id, category, text, source``); ``n_per_task``
    records per dataset, drawn without replacement with ``numpy.random.default_rng(seed)``.
    Needs the optional ``datasets`` package and either network access to the hub or a
    populated datasets cache; otherwise raises with the dataset's name and how to get it.
    """
    if not isinstance(n_per_task, (int, np.integer)) or n_per_task < 1:
        raise DataError(f"n_per_task must be a positive integer, got {n_per_task!r}.")
    cats = list(PROMPT_CATEGORIES) if categories is None else list(categories)
    unknown = [c for c in cats if c not in TASK_DATASETS]
    if unknown:
        raise DataError(f"No task dataset for {unknown}; choose from {list(TASK_DATASETS)}.")
    try:
        import datasets  # optional dependency, imported only here
    except ImportError as exc:
        raise ImportError(
            "load_task_prompts needs the optional 'datasets' package: `pip install datasets`. "
            "Without it, use load_prompts(), the project's own prompt set."
        ) from exc
    rng = np.random.default_rng(seed)
    rows = []
    for cat in cats:
        spec = TASK_DATASETS[cat]
        label = spec.path + (f"/{spec.name}" if spec.name else "")
        try:
            ds = datasets.load_dataset(spec.path, spec.name, split=spec.split)
        except Exception as exc:  # offline, not cached, renamed on the hub, ...
            raise TaskDataUnavailable(
                f"Could not load the task dataset {label!r} (split {spec.split!r}) for category {cat!r}: "
                f"{type(exc).__name__}: {exc}. It comes from the Hugging Face hub: run once with network "
                f'access (python -c "import datasets; datasets.load_dataset({spec.path!r}, {spec.name!r}, '
                f'split={spec.split!r})") to fill the datasets cache (HF_DATASETS_CACHE), then it loads '
                "offline; or use load_prompts(), the project's own prompt set."
            ) from exc
        size = len(ds)
        take = rng.choice(size, size=min(int(n_per_task), size), replace=False)
        for idx in take:
            record = ds[int(idx)]
            rows.append(
                {
                    "id": f"{cat}-{spec.split}-{int(idx)}",
                    "category": cat,
                    "text": spec.format(record),
                    "source": f"{label} ({spec.split} split, row {int(idx)}) via Hugging Face datasets",
                }
            )
    return pd.DataFrame(rows, columns=["id", "category", "text", "source"])


# ----------------------------------------------------------------------------- joins
