"""A plain training loop that answers idlegpu's checkpoint notices (standard library only).

    python train_loop.py --steps N --step-seconds S --checkpoint-dir DIR [--checkpoint-every K]
                         [--resume PATH] [--progress-every S] [--stop-timeout S]

Each step "trains" (sleeps ``--step-seconds`` and updates a toy state). After every step it
reports progress (rate-limited) and looks for a notice; at one it saves
``DIR/checkpoint.json`` (temporary file, then rename: a crash never leaves half a checkpoint),
acknowledges it and waits for the stop: the daemon's SIGTERM ends the process (status 143).
If no stop comes within ``--stop-timeout`` it trains on. ``--checkpoint-every K`` also saves
every K steps and reports those checkpoints. It resumes from ``--resume PATH``, else from
``DIR/checkpoint.json``, when the file is there (a stop before the first save leaves none),
and exits 0 once all steps are done.

One line per event on stdout: ``started step=0``, ``resumed step=12 path=...``,
``progress step=...``, ``notice deadline=...``, ``saved step=12 path=...``,
``acknowledged step=12``, ``acknowledgement failed: ...``, ``reported step=...``,
``waiting for stop``, ``no stop came: training on``, ``done step=N``.

The settings come from the environment idlegpu's Job template sets (``IDLEGPU_API_URL``,
``IDLEGPU_UNIT``, ``IDLEGPU_ATTEMPT``, ``IDLEGPU_TOKEN_FILE``, ``IDLEGPU_CA_FILE``,
``IDLEGPU_CHECKPOINT_REQUEST_FILE``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

try:
    from idlegpu.scheduler.workload import checkpoint as notices
except ImportError:  # the helper copied beside this file as idlegpu_checkpoint.py
    import idlegpu_checkpoint as notices  # type: ignore[no-redef]

CHECKPOINT_NAME = "checkpoint.json"


def say(line: str) -> None:
    # flushed: the lines are read through a pipe, and SIGTERM leaves no chance to flush later
    print(line, flush=True)


def save(directory: Path, step: int, state: float) -> Path:
    """Write the checkpoint atomically: a reader (or the next attempt) sees the old one or
    the new one, never half of one."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / CHECKPOINT_NAME
    fd, temporary = tempfile.mkstemp(prefix=f".{CHECKPOINT_NAME}.", dir=directory)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            json.dump({"step": step, "state": state}, out)
            out.flush()
            os.fsync(out.fileno())
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
    # the rename itself is durable only once the directory is
    dir_fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
    return path


def load(path: Path) -> tuple[int, float]:
    saved = json.loads(path.read_text(encoding="utf-8"))
    return int(saved["step"]), float(saved["state"])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, required=True, help="steps in all")
    parser.add_argument("--step-seconds", type=float, default=1.0, help="seconds per step")
    parser.add_argument("--checkpoint-dir", type=Path, required=True)
    parser.add_argument("--checkpoint-every", type=int, default=0,
                        help="also save every K steps (0: only at notices)")
    parser.add_argument("--resume", type=Path, help="checkpoint file to resume from")
    parser.add_argument("--progress-every", type=float, default=60.0,
                        help="seconds between progress reports")
    parser.add_argument("--stop-timeout", type=float, default=600.0,
                        help="seconds to wait for the stop after an acknowledgement")
    args = parser.parse_args(argv)

    resume = args.resume or args.checkpoint_dir / CHECKPOINT_NAME
    step, state = 0, 0.0
    if resume.is_file():
        step, state = load(resume)
        say(f"resumed step={step} path={resume}")
    else:
        # a stop before the first checkpoint: the resume arguments name a file not yet saved
        say(f"started step=0 (no checkpoint at {resume})" if args.resume else "started step=0")

    client = notices.default_client()
    while step < args.steps:
        time.sleep(args.step_seconds)
        step += 1
        state = 0.9 * state + step  # the "training"
        if client.report_progress(step, every_s=args.progress_every):
            say(f"progress step={step}")
        deadline = client.notice_pending()
        if deadline is not None:
            say(f"notice deadline={deadline.isoformat()}")
            path = save(args.checkpoint_dir, step, state)
            say(f"saved step={step} path={path}")
            try:
                client.acknowledge(step, str(path))
            except notices.CheckpointAckError as exc:
                # the stop comes at the deadline anyway, as a blind one; training on until
                # then loses nothing the saved checkpoint does not already keep
                say(f"acknowledgement failed: {exc}")
                continue
            say(f"acknowledged step={step}")
            say("waiting for stop")
            client.wait_for_stop(timeout=args.stop_timeout)
            say("no stop came: training on")
        elif args.checkpoint_every and step % args.checkpoint_every == 0:
            path = save(args.checkpoint_dir, step, state)
            say(f"saved step={step} path={path}")
            try:
                client.acknowledge(step, str(path))
                say(f"reported step={step}")
            except notices.CheckpointAckError as exc:
                say(f"checkpoint report failed: {exc}")
    say(f"done step={step}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
