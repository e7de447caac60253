"""What the training loop tells observers: the hooks of `TrainCallback` (TensorBoard, the hypertune report).

    >>> class Printer(TrainCallback):
    ...     def on_evaluate(self, step, epoch, scores):
    ...         print(step, scores["validation_matched"]["accuracy"])
    >>> run_training(cfg, callbacks=[Printer()])

The loop calls them on the main process only, with plain Python values, never device tensors.
"""

from __future__ import annotations


class TrainCallback:
    """Override the hooks you need."""

    def on_log(self, rows: list[dict]) -> None:
        """Per-step rows since the last log (step, epoch, loss, lr; the last adds examples_per_s, tokens_per_s)."""

    def on_evaluate(self, step: int, epoch: int, scores: dict[str, dict]) -> None:
        """Scores per validation split after an evaluation."""

    def on_train_end(self, metrics: dict) -> None:
        """The final metrics, before they are saved."""
