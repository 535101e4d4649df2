"""Checkpoint notices for the Hugging Face Trainer: a callback that saves, acknowledges and
stops.

::

    from idlegpu.scheduler.workload.transformers import IdlegpuCheckpointCallback

    notice = IdlegpuCheckpointCallback()
    trainer = Trainer(model=model, args=args, train_dataset=data, callbacks=[notice])
    resume = args.resume and get_last_checkpoint(args.output_dir)   # transformers.trainer_utils
    while True:
        trainer.train(resume_from_checkpoint=resume or None)
        if notice.saved_path is None:
            break                            # trained to the end: exit 0
        notice.wait_for_stop(timeout=600)    # ends the process at the daemon's SIGTERM (143)
        resume = notice.saved_path           # no stop came: train on from the checkpoint

At a notice (checked after every step) the callback asks the Trainer to save and stop
(``control.should_save``, ``control.should_training_stop``); when the Trainer has saved
``<output_dir>/checkpoint-<global_step>`` it acknowledges that directory from the main
process. An acknowledgement that fails after its retries is logged and training goes on
(``ack_error``; ``raise_on_ack_error=True`` raises it instead); the callback answers one
notice per ``train()``. The main process also reports progress every ``progress_every_s``.

Copied into an image beside ``idlegpu_checkpoint.py``, keep this file under another name than
``transformers.py`` (e.g. ``idlegpu_transformers.py``): it would hide the library.
"""

from __future__ import annotations

import os
from typing import Any

from transformers import TrainerCallback

try:
    from idlegpu.scheduler.workload import checkpoint as _notices
except ImportError:  # copied into an image beside it, as the helper's docs say
    import idlegpu_checkpoint as _notices  # type: ignore[no-redef]

__all__ = ["IdlegpuCheckpointCallback"]



class IdlegpuCheckpointCallback(TrainerCallback):
    """Save, acknowledge and stop at a checkpoint notice; report progress meanwhile."""

    def __init__(
        self,
        *,
        progress_every_s: float = 60.0,
        raise_on_ack_error: bool = False,
        client: _notices.Client | None = None,
    ):
        self.progress_every_s = progress_every_s
        self.raise_on_ack_error = raise_on_ack_error
        self.client = client or _notices.default_client()
        self.saved_path: str | None = None
        """The checkpoint saved and acknowledged for a notice; None while there was none."""
        self.answer: dict | None = None
        """The API's answer to the acknowledgement (``"stop": "within seconds"``, ...)."""
        self.ack_error: _notices.CheckpointAckError | None = None
        """Why a notice's checkpoint could not be acknowledged (training then goes on)."""
        self._saving = False
        self._answered = False
        self._stopping_anyway = False

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.saved_path = None
        self._saving = False
        self._answered = False

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if state.is_world_process_zero:
            self.client.report_progress(state.global_step, every_s=self.progress_every_s)
        if self._answered:
            # one notice per train(): after a failed acknowledgement the other ranks would
            # still see it as pending (only the main process acknowledged it)
            return
        if not _on_any_rank(self.client.notice_pending() is not None, args):
            return
        self._answered = True
        self._saving = True
        # set by max_steps already (DefaultFlowCallback runs first): then it stays set
        self._stopping_anyway = bool(control.should_training_stop)
        control.should_save = True
        control.should_training_stop = True

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if not self._saving:
            return
        self._saving = False
        # the Trainer's own folder for this save (Trainer._save_checkpoint)
        path = os.path.join(args.output_dir, f"checkpoint-{state.global_step}")
        failed = False
        if state.is_world_process_zero:
            self.answer, self.ack_error = self.client.acknowledge_or_warn(
                state.global_step, path, raise_on_error=self.raise_on_ack_error)
            failed = self.ack_error is not None
        if _on_any_rank(failed, args):
            # the stop comes at the deadline all the same, as a blind one: training on until
            # then loses nothing that stopping now would keep
            control.should_training_stop = self._stopping_anyway
            return
        self.saved_path = path

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.saved_path is not None:
            # whatever took SIGTERM over during training, it now ends the process (143)
            _notices.end_on_sigterm()

    def wait_for_stop(self, timeout: float | None = None) -> bool:
        """See ``Client.wait_for_stop``: after a notice was answered, wait for the stop."""
        return self.client.wait_for_stop(timeout)


def _on_any_rank(flag: bool, args: Any) -> bool:
    """True on every rank when it is on one: all ranks must save at the same step."""
    import torch
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() < 2:
        return flag
    vote = torch.tensor([1 if flag else 0], device=args.device)
    dist.all_reduce(vote, op=dist.ReduceOp.MAX)
    return bool(vote.item())
