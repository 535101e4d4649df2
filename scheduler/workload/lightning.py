"""Checkpoint notices for PyTorch Lightning: a callback that saves, acknowledges and stops.

::

    from idlegpu.scheduler.workload.lightning import IdlegpuCheckpoint

    ckpt = args.resume if args.resume and os.path.exists(args.resume) else None
    while True:
        notice = IdlegpuCheckpoint()
        trainer = L.Trainer(max_steps=10_000, callbacks=[notice])
        trainer.fit(model, ckpt_path=ckpt)
        if notice.saved_path is None:
            break                            # trained to the end: exit 0
        notice.wait_for_stop(timeout=600)    # ends the process at the daemon's SIGTERM (143)
        ckpt = notice.saved_path             # no stop came: train on from the checkpoint

At a notice the callback saves ``<dirpath>/<filename>`` with ``trainer.save_checkpoint`` on
every rank, acknowledges it from rank 0 and sets ``trainer.should_stop`` (Lightning honours it
only once ``min_steps``/``min_epochs`` are reached). ``dirpath`` defaults to ``IDLEGPU_OUTPUT``
when set, else the trainer's ``default_root_dir``; the file name is fixed so that the request's
``checkpoint.resume_args`` can name it. An acknowledgement that fails after its retries is
logged and training goes on (``ack_error``; ``raise_on_ack_error=True`` raises it instead);
the callback answers one notice per ``fit``.
Rank 0 also reports progress every ``progress_every_s``.

Works with ``lightning`` (``lightning.pytorch``) or ``pytorch_lightning``; with both installed
the class is a ``lightning.pytorch`` callback, and ``callback_class(pytorch_lightning.Callback)``
makes one for a ``pytorch_lightning.Trainer``. Copied into an image beside
``idlegpu_checkpoint.py``, keep this file under another name than ``lightning.py`` (e.g.
``idlegpu_lightning.py``): it would hide the framework.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

try:
    from idlegpu.scheduler.workload import checkpoint as _notices
except ImportError:  # copied into an image beside it, as the helper's docs say
    import idlegpu_checkpoint as _notices  # type: ignore[no-redef]

if TYPE_CHECKING:  # checked as lightning.pytorch's (the two packages' classes are distinct)
    from lightning.pytorch import Callback as _Callback
else:
    try:
        from lightning.pytorch import Callback as _Callback
    except ImportError:
        from pytorch_lightning import Callback as _Callback

__all__ = ["IdlegpuCheckpoint", "callback_class"]


DEFAULT_FILENAME = "idlegpu-notice.ckpt"


class _NoticeSaver:
    def __init__(
        self,
        dirpath: str | os.PathLike[str] | None = None,
        *,
        filename: str = DEFAULT_FILENAME,
        progress_every_s: float = 60.0,
        raise_on_ack_error: bool = False,
        client: _notices.Client | None = None,
    ):
        super().__init__()
        self.dirpath = os.fspath(dirpath) if dirpath is not None else None
        self.filename = filename
        self.progress_every_s = progress_every_s
        self.raise_on_ack_error = raise_on_ack_error
        self.client = client or _notices.default_client()
        self._answered = False
        self.saved_path: str | None = None
        """The checkpoint saved and acknowledged for a notice; None while there was none."""
        self.answer: dict | None = None
        """The API's answer to the acknowledgement (``"stop": "within seconds"``, ...)."""
        self.ack_error: _notices.CheckpointAckError | None = None
        """Why a notice's checkpoint could not be acknowledged (training then goes on)."""

    def checkpoint_path(self, trainer: Any) -> str:
        directory = self.dirpath or os.environ.get("IDLEGPU_OUTPUT") or trainer.default_root_dir
        # fsspec URLs (s3://...) as well as local paths: trainer.save_checkpoint takes both
        return f"{str(directory).rstrip('/')}/{self.filename}"

    def on_fit_start(self, trainer: Any, pl_module: Any) -> None:
        self.saved_path = None
        self._answered = False

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        step = trainer.global_step
        if trainer.is_global_zero:
            self.client.report_progress(step, every_s=self.progress_every_s)
        if self._answered:
            # one notice per fit: after a failed acknowledgement the other ranks would still
            # see it as pending (only rank 0 acknowledged it)
            return
        pending = self.client.notice_pending() is not None
        if trainer.world_size > 1:
            # every rank saves (a collective under DDP/FSDP/DeepSpeed), so all must agree on
            # the step: one rank seeing the notice is enough
            pending = trainer.strategy.reduce_boolean_decision(pending, all=False)
        if not pending:
            return
        self._answered = True
        path = self.checkpoint_path(trainer)
        trainer.save_checkpoint(path)
        failed = False
        if trainer.is_global_zero:
            self.answer, self.ack_error = self.client.acknowledge_or_warn(
                step, path, raise_on_error=self.raise_on_ack_error)
            failed = self.ack_error is not None
        if trainer.world_size > 1:
            failed = trainer.strategy.broadcast(failed, src=0)
        if failed:
            # the stop comes at the deadline all the same, as a blind one: training on until
            # then loses nothing that stopping now would keep
            return
        self.saved_path = path
        trainer.should_stop = True

    def on_fit_end(self, trainer: Any, pl_module: Any) -> None:
        if self.saved_path is not None:
            # the trainer's teardown has just put back the SIGTERM handler from before fit
            _notices.end_on_sigterm()

    def wait_for_stop(self, timeout: float | None = None) -> bool:
        """See ``Client.wait_for_stop``: after a notice was answered, wait for the stop."""
        return self.client.wait_for_stop(timeout)


def callback_class(base: type) -> type:
    """The callback on another Lightning ``Callback`` base (``pytorch_lightning.Callback``)."""
    return type("IdlegpuCheckpoint", (_NoticeSaver, base), {"__module__": __name__})


class IdlegpuCheckpoint(_NoticeSaver, _Callback):
    """Save, acknowledge and stop at a checkpoint notice; report progress meanwhile."""
