"""The workload's side of checkpoint notices: what runs inside a research Job's container.

:mod:`idlegpu.scheduler.workload.checkpoint` is the helper (standard library only, so it also
works copied alone into an image as ``idlegpu_checkpoint.py``); ``lightning`` and
``transformers`` hold thin callbacks for PyTorch Lightning and the Hugging Face Trainer. This
package imports none of them: importing a callback module is what pulls in its framework.
"""
