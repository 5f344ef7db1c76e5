"""A helper the training tests share: held-out scores scripted, so a test knows which epoch is best."""
from __future__ import annotations

import dataclasses
from typing import Sequence


def script_held_out_scores(monkeypatch, accuracies: Sequence[float]) -> None:
    """Each evaluated epoch of ``capsnet.train.fit`` scores ``accuracies`` in turn (error 1 - accuracy), the model
    still evaluated as usual; ``monkeypatch.undo()`` ends it."""
    import capsnet.train as train_mod

    real, scripted = train_mod.evaluate_split, iter(accuracies)

    def scored(*args, **kwargs):
        results = real(*args, **kwargs)
        acc = next(scripted)
        return {k: dataclasses.replace(r, accuracy=acc, error=1 - acc) for k, r in results.items()}
    monkeypatch.setattr(train_mod, "evaluate_split", scored)
