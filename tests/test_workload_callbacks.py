"""The checkpoint-notice callbacks on real, tiny CPU trainings: PyTorch Lightning's
(idlegpu.scheduler.workload.lightning) and the Hugging Face Trainer's
(idlegpu.scheduler.workload.transformers).

Each training runs in a subprocess against test_workload_helper's ``RecordingApi`` (a
stand-in for the job API's checkpoint endpoint): the test writes the notice file mid-training,
the callback saves and acknowledges, the test sends SIGTERM after the acknowledgement, and a
second run resumes from the saved checkpoint and trains to the end. The models are built here
(no hub downloads); the frameworks come with the ``workload-test`` extra, and a missing one
fails these tests."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

from test_workload_helper import Lines, RecordingApi, fields

COMMON = """
import os, sys, time
import torch
from idlegpu.scheduler.workload.checkpoint import Client

STEP_S = 0.02
torch.manual_seed(0)
torch.set_num_threads(1)
client = Client.from_env(check_every_s=0.05)
resume = sys.argv[2] if len(sys.argv) > 2 else None
max_steps = int(sys.argv[1])


class Tiny(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(),
                                       torch.nn.Linear(8, 1))

    def forward(self, x, labels=None):
        time.sleep(STEP_S)  # slow enough for the test to write the notice mid-training
        out = self.net(x)
        return out if labels is None else {"loss": torch.nn.functional.mse_loss(out, labels),
                                           "logits": out}


X, Y = torch.randn(64, 4), torch.randn(64, 1)
"""

LIGHTNING = COMMON + """
import lightning.pytorch as L
from torch.utils.data import DataLoader, TensorDataset
from idlegpu.scheduler.workload.lightning import IdlegpuCheckpoint


class Module(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.model = Tiny()

    def training_step(self, batch, batch_idx):
        x, y = batch
        return self.model(x, y)["loss"]

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


class Print(L.Callback):
    def on_train_start(self, trainer, pl_module):
        print(f"start step={trainer.global_step}", flush=True)


notice = IdlegpuCheckpoint(client=client, progress_every_s=0.2)  # dir: IDLEGPU_OUTPUT
trainer = L.Trainer(max_steps=max_steps, accelerator="cpu", devices=1, logger=False,
                    enable_checkpointing=False, enable_progress_bar=False,
                    enable_model_summary=False, callbacks=[Print(), notice])
trainer.fit(Module(), DataLoader(TensorDataset(X, Y), batch_size=4), ckpt_path=resume)
if notice.saved_path is None:
    print(f"done step={trainer.global_step}", flush=True)
    sys.exit(0)
print(f"stopped step={trainer.global_step} path={notice.saved_path}", flush=True)
notice.wait_for_stop(timeout=60)
sys.exit(5)  # no stop came: not for this test
"""

TRANSFORMERS = COMMON + """
from transformers import Trainer, TrainerCallback, TrainingArguments
from idlegpu.scheduler.workload.transformers import IdlegpuCheckpointCallback


class Data(torch.utils.data.Dataset):
    def __len__(self):
        return len(X)

    def __getitem__(self, i):
        return {"x": X[i], "labels": Y[i]}


class Print(TrainerCallback):
    def on_train_begin(self, args, state, control, **kwargs):
        print(f"start step={state.global_step}", flush=True)


args = TrainingArguments(output_dir=os.environ["OUT"], max_steps=max_steps,
                         per_device_train_batch_size=4, learning_rate=0.01,
                         save_strategy="no", logging_strategy="no", report_to=[],
                         use_cpu=True, disable_tqdm=True, dataloader_num_workers=0, seed=0)
notice = IdlegpuCheckpointCallback(client=client, progress_every_s=0.2)
trainer = Trainer(model=Tiny(), args=args, train_dataset=Data(), callbacks=[Print(), notice])
trainer.train(resume_from_checkpoint=resume)
if notice.saved_path is None:
    print(f"done step={trainer.state.global_step}", flush=True)
    sys.exit(0)
print(f"stopped step={trainer.state.global_step} path={notice.saved_path}", flush=True)
notice.wait_for_stop(timeout=60)
sys.exit(5)  # no stop came: not for this test
"""


def start(tmp_path: Path, api: RecordingApi, script: str, *args: str
          ) -> tuple[subprocess.Popen, Lines]:
    (tmp_path / "train.py").write_text(script)
    env = {**os.environ, "IDLEGPU_API_URL": api.url, "IDLEGPU_UNIT": "unit-cb-1",
           "IDLEGPU_ATTEMPT": "1", "IDLEGPU_TOKEN_FILE": str(tmp_path / "token"),
           "IDLEGPU_CHECKPOINT_REQUEST_FILE": str(tmp_path / "notice"),
           "IDLEGPU_OUTPUT": str(tmp_path / "out"), "OUT": str(tmp_path / "out"),
           "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf"),
           "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    process = subprocess.Popen([sys.executable, str(tmp_path / "train.py"), *args],
                               cwd=tmp_path, env=env, text=True, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE)
    return process, Lines(process)


def notice_stop_resume(tmp_path: Path, script: str) -> tuple[dict, Path]:
    """Train, answer a notice, get stopped, resume: the acknowledgement and the checkpoint."""
    (tmp_path / "token").write_text("pod-token")
    api = RecordingApi()
    try:
        process, lines = start(tmp_path, api, script, "100000")
        try:
            assert lines.expect("start step=", timeout=120) == "start step=0"
            api.wait_for("progress", timeout=60)
            deadline = datetime.now(UTC) + timedelta(minutes=2)
            (tmp_path / "notice").write_text(deadline.strftime("%Y-%m-%dT%H:%M:%SZ"))
            ack = api.wait_for("checkpoint", timeout=60)["body"]
            stopped = fields(lines.expect("stopped step=", timeout=60))
            process.send_signal(signal.SIGTERM)
            process.wait(timeout=60)
        finally:
            process.kill()
        assert process.returncode == -signal.SIGTERM, process.stderr.read()
        assert ack["attempt"] == 1 and ack["step"] > 0
        assert (ack["step"], ack["path"]) == (int(stopped["step"]), stopped["path"])
        checkpoint = Path(ack["path"])
        assert checkpoint.exists()

        (tmp_path / "notice").write_text("")
        process, lines = start(tmp_path, api, script, str(ack["step"] + 5), str(checkpoint))
        try:
            # the resumed training starts at the acknowledged step and runs to its end
            assert lines.expect("start step=", timeout=120) == f"start step={ack['step']}"
            assert lines.expect("done step=", timeout=120) == f"done step={ack['step'] + 5}"
            assert process.wait(timeout=60) == 0, process.stderr.read()
        finally:
            process.kill()
    finally:
        api.close()
    return ack, checkpoint


def test_the_lightning_callback_saves_acknowledges_and_resumes(tmp_path):
    _, checkpoint = notice_stop_resume(tmp_path, LIGHTNING)
    assert checkpoint == tmp_path / "out" / "idlegpu-notice.ckpt"  # under IDLEGPU_OUTPUT


def test_the_trainer_callback_saves_acknowledges_and_resumes(tmp_path):
    ack, checkpoint = notice_stop_resume(tmp_path, TRANSFORMERS)
    assert checkpoint == tmp_path / "out" / f"checkpoint-{ack['step']}"
    assert (checkpoint / "trainer_state.json").is_file()
