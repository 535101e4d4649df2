"""A deterministic, realistic job trace for simulating the sample pool (``data/sample/jobs.yaml``).

Four months (2025-10-01 to 2026-01-31, Asia/Seoul) of research jobs submitted to the idle
GPUs of the sample pool, which frees about 48 GPUs through a typical night, about 46 on weekends
and 4-8 by day. Adoption grows month by month (26 jobs in October to 37 in January, like the
operator's report), from a few teams to six. The mix:

- large pretraining runs: 24-32 GPUs and 120-320 hours of work, checkpointing, needing many
  nights (one a month, two in January);
- SFT and RL runs: 8-16 GPUs, 4-20 hours, some checkpointing; SFT -> RL -> eval pipelines;
- evaluations and data generation that must fit whole (no checkpoint): 4-8 GPUs (rarely 2),
  1-6 hours, some with a deadline or a preemption limit;
- sweeps: evaluations over 4-8 grid points, data generation over 4 shards.

The true work of each unit (``actual_runtime``) differs from the user's ``runtime_estimate`` by
a lognormal factor with median 1.12 (users underestimate). Regenerate, byte for byte, with::

    python -m idlegpu.scheduler.sample_jobs --out data/sample/jobs.yaml
"""

from __future__ import annotations

import argparse
import calendar
import math
import random
from collections.abc import Callable
from dataclasses import dataclass
from datetime import date, datetime, timedelta
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import yaml

from idlegpu.scheduler.runtime import REGISTRY
from idlegpu.scheduler.specs import format_duration

SEED = 20251001
TZ = ZoneInfo("Asia/Seoul")
MONTHS: tuple[tuple[int, int, int, int], ...] = (
    # year, month, jobs submitted, of which large pretraining runs
    (2025, 10, 26, 3),
    (2025, 11, 29, 4),
    (2025, 12, 32, 5),
    (2026, 1, 37, 6),
)
PRETRAIN_HOURS = ((120, 200), (150, 250), (180, 300), (200, 320))
"""Range of the work of a large pretraining run (hours on 24-32 GPUs), per month."""
HOLIDAYS = frozenset({
    date(2025, 10, 3), date(2025, 10, 6), date(2025, 10, 7), date(2025, 10, 8),
    date(2025, 10, 9), date(2025, 10, 10), date(2025, 12, 25), date(2026, 1, 1),
})
"""Korean public holidays of the period (Chuseok, National Foundation and Hangul days, the
bridge day after them, Christmas, New Year): few submissions."""
TEAMS_FROM: dict[str, tuple[int, int]] = {
    "foundation": (2025, 10), "alignment": (2025, 10), "evaluation": (2025, 10),
    "data": (2025, 11), "multimodal": (2025, 12), "agents": (2026, 1),
}
"""The month each team starts using the pool."""
KIND_TEAMS: dict[str, tuple[str, ...]] = {
    "pretrain": ("foundation",),
    "sft": ("alignment", "multimodal", "agents"),
    "rl": ("alignment", "agents"),
    "pipeline": ("alignment", "agents"),
    "eval": ("evaluation", "foundation", "alignment", "multimodal", "agents"),
    "eval_sweep": ("evaluation", "foundation", "alignment"),
    "datagen": ("data", "alignment", "multimodal", "agents"),
}
MIX: dict[str, float] = {
    "sft": 0.16, "rl": 0.12, "pipeline": 0.08, "eval": 0.30, "eval_sweep": 0.14, "datagen": 0.20,
}
"""Shares of the jobs that are not large pretraining runs."""
OUTPUT = "s3://idlegpu-runs/{team}/{name}/{step}/{member}"
BENCHMARKS = ("kmmlu", "haerae", "mmlu_pro", "gsm8k", "humaneval", "ifeval", "kobest", "math500")
BASE_MODELS = ("dense-3b", "dense-7b", "dense-32b", "moe-16b")


@dataclass
class _Job:
    submit: datetime
    kind: str
    team: str
    body: dict[str, Any]
    """The request (without name) and ``actual_runtime``; filled by the archetype."""


class _Rng(random.Random):
    def log_uniform(self, low: float, high: float) -> float:
        return math.exp(self.uniform(math.log(low), math.log(high)))

    def misestimate(self) -> float:
        """Actual work / user's estimate: lognormal, median 1.12 (users underestimate)."""
        return min(2.5, max(0.6, self.lognormvariate(math.log(1.12), 0.25)))

    def image(self, name: str, versions: tuple[str, ...], month: int) -> str:
        # Newer releases over the months, some teams staying a version behind.
        index = min(len(versions) - 1, max(0, month - self.choice((0, 0, 1))))
        return f"{REGISTRY}{name}:{versions[index]}"


def _estimate(rng: _Rng, work_h: float) -> str:
    """The user's estimate of ``work_h`` hours of work, rounded the way people round."""
    hours = work_h / rng.misestimate()
    step = 1.0 if hours >= 10 else 0.5 if hours >= 3 else 0.25
    return format_duration(max(step, round(hours / step) * step) * 3600)


def _actual(work_h: float) -> str:
    return format_duration(round(work_h * 60) * 60)


def _pretrain(rng: _Rng, job: _Job, m: int) -> None:
    model = rng.choice(("dense-7b", "dense-7b", "moe-16b", "dense-13b"))
    # early adopters try shorter runs first; the longest ones come once the pool is trusted
    work = rng.uniform(*PRETRAIN_HOURS[m])
    job.body.update(
        actual_runtime=_actual(work),
        image=rng.image("megatron-train", ("2025.10.1", "2025.11.0", "2025.12.2", "2026.01.0"), m),
        command=["torchrun", "--nproc-per-node=8", "pretrain.py"],
        args=["--model-config=configs/{model}.yaml", "--data={data}", "--lr={lr}",
              "--train-tokens={train_tokens}", "--save={output}/ckpt"],
        parameters={
            "model": model,
            "data": f"s3://research-data/pretrain/ko-en-mix-v{rng.choice((3, 3, 4))}",
            "lr": rng.choice((1.5e-4, 3.0e-4, 4.0e-4)),
            "train_tokens": f"{rng.choice((100, 150, 200, 300))}B",
        },
        gpus=rng.choice((32, 32, 32, 32, 24)),
        runtime_estimate=_estimate(rng, work),
        checkpoint={"interval": rng.choice(("20m", "30m", "30m", "1h")),
                    "resume_args": ["--resume", "{output}/ckpt/latest"]},
        output=OUTPUT,
    )
    if rng.random() < 0.5:
        job.body["max_preemptions"] = rng.choice((30, 50))


def _train_step(rng: _Rng, kind: str, m: int, work: float, gpus: int,
                checkpointable: bool) -> dict[str, Any]:
    if kind == "sft":
        body: dict[str, Any] = {
            "image": rng.image("trl-sft", ("0.11.4", "0.12.0", "0.12.2", "0.13.1"), m),
            "command": ["accelerate", "launch", "sft.py"],
            "args": ["--model", "{base_model}", "--data", "{data}", "--epochs", "{epochs}",
                     "--lr", "{lr}", "--out", "{output}"],
            "parameters": {
                "base_model": f"s3://model-zoo/{rng.choice(BASE_MODELS)}/base",
                "data": f"s3://research-data/sft/{rng.choice(('chat', 'code', 'math', 'tool'))}"
                        f"-mix-r{rng.randint(8, 20)}",
                "epochs": rng.choice((1, 2, 3)),
                "lr": rng.choice((1.0e-5, 2.0e-5, 5.0e-6)),
            },
        }
        resume = ["--resume-from", "{output}/checkpoints"]
    else:
        body = {
            "image": rng.image("verl-rl", ("0.3.2", "0.4.0", "0.4.1", "0.5.0"), m),
            "command": ["python", "-m", "verl.trainer.main_ppo"],
            "args": ["algorithm={algorithm}", "actor.model={policy}", "data.train={prefs}",
                     "trainer.total_steps={rl_steps}", "trainer.save_dir={output}"],
            "parameters": {
                "algorithm": rng.choice(("grpo", "grpo", "ppo", "dapo")),
                "policy": f"s3://model-zoo/{rng.choice(BASE_MODELS)}/sft-r{rng.randint(8, 20)}",
                "prefs": "s3://research-data/rl/"
                         f"{rng.choice(('prefs', 'verifiable-math', 'code-tests'))}-2025q4",
                "rl_steps": rng.choice((300, 500, 800, 1200)),
            },
        }
        resume = ["trainer.resume_mode=auto"]
    body["gpus"] = gpus
    body["runtime_estimate"] = _estimate(rng, work)
    if checkpointable:
        body["checkpoint"] = {"interval": rng.choice(("15m", "20m", "30m")), "resume_args": resume}
    return body


def _sft_or_rl(kind: str) -> Callable[[_Rng, _Job, int], None]:
    def make(rng: _Rng, job: _Job, m: int) -> None:
        low = 4 if kind == "sft" else 6
        work = rng.log_uniform(low, 20)
        gpus = rng.choice((8, 8, 16)) if kind == "sft" else rng.choice((8, 16, 16))
        checkpointable = rng.random() < (0.6 if kind == "sft" else 0.5)
        job.body.update(actual_runtime=_actual(work),
                        **_train_step(rng, kind, m, work, gpus, checkpointable), output=OUTPUT)
        if not checkpointable and rng.random() < 0.5:
            job.body["max_preemptions"] = rng.choice((2, 3))

    return make


def _eval_args() -> list[str]:
    return ["--model=vllm", "--model_args=pretrained={model},tensor_parallel_size={gpus}",
            "--tasks={benchmark}", "--output_path={output}"]


def _eval_image(rng: _Rng, m: int) -> str:
    return rng.image("lm-eval", ("0.4.4", "0.4.5", "0.4.5", "0.4.7"), m)


def _pipeline(rng: _Rng, job: _Job, m: int) -> None:
    gpus = rng.choice((8, 16))
    sft_work, rl_work = rng.log_uniform(4, 10), rng.log_uniform(5, 12)
    benchmarks = rng.sample(BENCHMARKS, rng.choice((2, 3, 4)))
    eval_base = rng.uniform(1, 3)
    eval_work = [eval_base * rng.uniform(0.8, 1.25) for _ in benchmarks]
    sft = _train_step(rng, "sft", m, sft_work, gpus, True)
    rl = _train_step(rng, "rl", m, rl_work, gpus, True)
    # each step reads the output of the one before it (the same template as `output`)
    rl["args"][1] = "actor.model=s3://idlegpu-runs/{team}/{name}/sft/0"
    del rl["parameters"]["policy"]
    eval_args = _eval_args()
    eval_args[1] = (
        "--model_args=pretrained=s3://idlegpu-runs/{team}/{name}/rl/0,tensor_parallel_size={gpus}"
    )
    job.body.update(
        actual_runtime={"sft": _actual(sft_work), "rl": _actual(rl_work),
                        "eval": [_actual(w) for w in eval_work]},
        output=OUTPUT,
        steps=[
            {"name": "sft", "kind": "sft", **sft},
            {"name": "rl", "kind": "rl", **rl},
            {"name": "eval", "kind": "eval", "image": _eval_image(rng, m), "command": ["lm_eval"],
             "args": eval_args, "gpus": rng.choice((4, 8)),
             "runtime_estimate": _estimate(rng, eval_base),
             "sweep": {"benchmark": benchmarks}},
        ],
    )


def _eval(rng: _Rng, job: _Job, m: int) -> None:
    work = rng.log_uniform(1, 6)
    job.body.update(
        actual_runtime=_actual(work),
        image=_eval_image(rng, m),
        command=["lm_eval"],
        args=_eval_args(),
        parameters={"model": _model_under_test(rng, job),
                    "benchmark": ",".join(rng.sample(BENCHMARKS, rng.choice((1, 2, 3))))},
        gpus=rng.choices((2, 4, 8), (0.06, 0.5, 0.44))[0],
        output=OUTPUT,
    )
    if rng.random() < 0.9:
        job.body["runtime_estimate"] = _estimate(rng, work)
    _urgency(rng, job)


def _model_under_test(rng: _Rng, job: _Job) -> str:
    return (f"s3://idlegpu-runs/{job.team}/{rng.choice(('pretrain', 'sft', 'rl'))}-"
            f"{rng.choice(BASE_MODELS)}/main/0/step-{rng.randrange(2000, 40001, 2000)}")


def _urgency(rng: _Rng, job: _Job) -> None:
    if rng.random() < 0.2:
        job.body["priority"] = 1
    if rng.random() < 0.3:
        due = (job.submit + timedelta(days=rng.choice((2, 3, 4)))).replace(
            hour=9, minute=0, second=0
        )
        job.body["deadline"] = _Timestamp(due.isoformat())
    if rng.random() < 0.4:
        job.body["max_preemptions"] = rng.choice((2, 3))


def _eval_sweep(rng: _Rng, job: _Job, m: int) -> None:
    shape = rng.choice(((4,), (2, 2), (3, 2), (2, 3), (6,), (8,), (4, 2), (5,)))
    steps = rng.sample(range(4000, 60001, 4000), shape[0])
    sweep: dict[str, list[Any]] = {"checkpoint": [f"step-{s}" for s in sorted(steps)]}
    if len(shape) == 2:
        sweep["benchmark"] = rng.sample(BENCHMARKS, shape[1])
    base = rng.log_uniform(1, 4)
    members = math.prod(shape)
    work = [base * rng.uniform(0.8, 1.25) for _ in range(members)]
    params: dict[str, Any] = {
        "ckpt_root": f"s3://idlegpu-runs/{job.team}/{rng.choice(('pretrain', 'sft'))}-"
                     f"{rng.choice(BASE_MODELS)}/main/0/ckpt",
    }
    if len(shape) == 1:
        params["benchmark"] = ",".join(rng.sample(BENCHMARKS, 2))
    job.body.update(
        actual_runtime={"main": [_actual(w) for w in work]},
        image=_eval_image(rng, m),
        command=["lm_eval"],
        args=["--model=vllm",
              "--model_args=pretrained={ckpt_root}/{checkpoint},tensor_parallel_size={gpus}",
              "--tasks={benchmark}", "--output_path={output}"],
        parameters=params,
        sweep=sweep,
        gpus=rng.choice((4, 8)),
        runtime_estimate=_estimate(rng, base),
        output=OUTPUT,
    )
    _urgency(rng, job)


def _datagen(rng: _Rng, job: _Job, m: int) -> None:
    sharded = rng.random() < 0.3
    work = rng.log_uniform(1, 3) if sharded else rng.log_uniform(1, 6)
    job.body.update(
        image=rng.image("vllm-datagen", ("0.6.1", "0.6.3", "0.7.0", "0.7.2"), m),
        command=["python", "generate.py"],
        args=["--model", "{model}", "--prompts", "{prompts}", "--n", "{samples}",
              "--temperature", "{temperature}", "--out", "{output}/data.jsonl"],
        parameters={
            "model": f"s3://model-zoo/{rng.choice(('dense-32b', 'moe-16b', 'dense-7b'))}/instruct",
            "prompts": "s3://research-data/prompts/"
                       f"{rng.choice(('math', 'code', 'dialog', 'tool'))}"
                       f"-{rng.choice(('ko', 'en'))}-v{rng.randint(1, 4)}",
            "samples": rng.choice((1, 4, 8)),
            "temperature": rng.choice((0.7, 0.8, 1.0)),
        },
        gpus=rng.choices((2, 4, 8), (0.06, 0.6, 0.34))[0],
        output=OUTPUT,
    )
    if sharded:
        job.body["args"][3] = "{prompts}/shard-{shard}.jsonl"
        job.body["sweep"] = {"shard": [0, 1, 2, 3]}
        job.body["actual_runtime"] = {
            "main": [_actual(work * rng.uniform(0.85, 1.2)) for _ in range(4)]
        }
    else:
        job.body["actual_runtime"] = _actual(work)
    if rng.random() < 0.9:
        job.body["runtime_estimate"] = _estimate(rng, work)
    if rng.random() < 0.5:
        job.body["priority"] = -1


ARCHETYPES: dict[str, Callable[[_Rng, _Job, int], None]] = {
    "pretrain": _pretrain, "sft": _sft_or_rl("sft"), "rl": _sft_or_rl("rl"),
    "pipeline": _pipeline, "eval": _eval, "eval_sweep": _eval_sweep, "datagen": _datagen,
}
KIND_OF = {"pretrain": "training", "pipeline": "sft", "eval_sweep": "eval"}
NAME_OF = {
    "pretrain": "pretrain", "sft": "sft", "rl": "rl", "pipeline": "post-train",
    "eval": "eval", "eval_sweep": "eval-sweep", "datagen": "datagen",
}


ORDER = (
    "name", "kind", "image", "command", "args", "parameters", "sweep", "gpus", "runtime_estimate",
    "checkpoint", "priority", "deadline", "max_preemptions", "output", "steps",
)
"""Field order of the written entries (after name, submit_at, actual_runtime, team, kind)."""


class _Timestamp(str):
    """An ISO 8601 time written unquoted."""


OFFICE_HOURS = [0.2] * 8 + [1, 2, 3, 2, 1, 3, 3, 3, 3, 2, 2, 1.5, 1.5, 1, 1, 0.5]
"""Relative weight of each local hour for a working-day submission."""


def _submit_time(rng: _Rng, year: int, month: int, last_day: int) -> datetime:
    days = [date(year, month, d) for d in range(1, last_day + 1)]
    weights = [
        0.2 if d in HOLIDAYS else 0.25 if d.weekday() >= 5 else 1.0 for d in days
    ]
    day = rng.choices(days, weights)[0]
    if day.weekday() >= 5 or day in HOLIDAYS:
        hour = rng.randint(10, 22)
    else:
        hour = rng.choices(range(24), OFFICE_HOURS)[0]
    return datetime(day.year, day.month, day.day, hour, rng.randrange(0, 60), tzinfo=TZ)


def _month_end(year: int, month: int) -> int:
    return calendar.monthrange(year, month)[1]


def _apportion(count: int) -> list[str]:
    """``count`` archetypes in the shares of ``MIX`` (largest remainders)."""
    quotas = {k: share * count for k, share in MIX.items()}
    counts = {k: int(q) for k, q in quotas.items()}
    by_remainder = sorted(quotas, key=lambda k: (counts[k] - quotas[k], k))
    for k in by_remainder[: count - sum(counts.values())]:
        counts[k] += 1
    return [k for k in MIX for _ in range(counts[k])]


def generate(seed: int = SEED) -> list[dict[str, Any]]:
    """The trace entries (request fields plus ``submit_at`` and ``actual_runtime``), in
    submission order."""
    rng = _Rng(seed)
    jobs: list[_Job] = []
    for index, (year, month, count, large) in enumerate(MONTHS):
        teams = [t for t, start in TEAMS_FROM.items() if start <= (year, month)]
        kinds = ["pretrain"] * large + _apportion(count - large)
        rng.shuffle(kinds)
        for archetype in kinds:
            # big runs are started early in the month, so they can finish inside the trace
            end = 21 if archetype == "pretrain" else _month_end(year, month)
            submit = _submit_time(rng, year, month, end)
            team = rng.choice([t for t in KIND_TEAMS[archetype] if t in teams])
            job = _Job(submit, archetype, team, {})
            ARCHETYPES[archetype](rng, job, index)
            jobs.append(job)
    jobs.sort(key=lambda j: j.submit)
    entries = []
    for seq, job in enumerate(jobs, start=1):
        body = job.body
        entry: dict[str, Any] = {
            "name": f"{NAME_OF[job.kind]}-{job.submit:%m%d}-{seq:03d}",
            "submit_at": _Timestamp(job.submit.isoformat()),
            "actual_runtime": body.pop("actual_runtime"),
            "team": job.team,
            "kind": KIND_OF.get(job.kind, job.kind),
        }
        entry.update(sorted(body.items(), key=lambda kv: ORDER.index(kv[0])))
        for step in entry.get("steps", ()):
            step_items = sorted(step.items(), key=lambda kv: ORDER.index(kv[0]))
            step.clear()
            step.update(step_items)
        entries.append(entry)
    return entries


class _Dumper(yaml.SafeDumper):
    pass


def _represent_list(dumper: yaml.SafeDumper, data: list[Any]) -> yaml.Node:
    flat = all(not isinstance(v, dict | list) for v in data)
    return dumper.represent_sequence("tag:yaml.org,2002:seq", data, flow_style=flat)


def _represent_timestamp(dumper: yaml.SafeDumper, data: _Timestamp) -> yaml.Node:
    return dumper.represent_scalar("tag:yaml.org,2002:timestamp", str(data))


_Dumper.add_representer(list, _represent_list)
_Dumper.add_representer(_Timestamp, _represent_timestamp)

HEADER = """\
# A job trace for simulating the sample pool (data/sample/history.parquet), 2025-10-01 to
# 2026-01-31, Asia/Seoul. Generated by `python -m idlegpu.scheduler.sample_jobs --out
# data/sample/jobs.yaml` (seed {seed}); do not edit by hand. Load it with
# idlegpu.scheduler.specs.load_trace.
#
# Each entry is a job request (see examples/jobs/) plus two trace-only fields:
#   submit_at       when the request is submitted
#   actual_runtime  the work each unit really needs, unknown to the scheduler: one duration for
#                   every unit, or one per step, or per step one per sweep member
# The request's runtime_estimate is the user's guess (the true work is a lognormal factor,
# median 1.12, above or below it).
#
# {summary}
"""


def render(entries: list[dict[str, Any]], seed: int = SEED) -> str:
    """The YAML text of ``entries``, with a header and one comment line per month."""
    per_month: dict[str, int] = {}
    for e in entries:
        key = str(e["submit_at"])[:7]
        per_month[key] = per_month.get(key, 0) + 1
    summary = "Jobs per month: " + ", ".join(f"{k} {v}" for k, v in per_month.items()) + "."
    out = [HEADER.format(seed=seed, summary=summary), "jobs:\n"]
    month = ""
    for entry in entries:
        if str(entry["submit_at"])[:7] != month:
            month = str(entry["submit_at"])[:7]
            out.append(f"\n# ---- {month}: {per_month[month]} jobs ----\n")
        out.append(yaml.dump([entry], Dumper=_Dumper, sort_keys=False, width=100,
                             allow_unicode=True, default_flow_style=False))
    return "".join(out)


def write(out: str | Path, seed: int = SEED) -> Path:
    path = Path(out)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(render(generate(seed), seed), encoding="utf-8")
    return path


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="data/sample/jobs.yaml", help="YAML file to write")
    parser.add_argument("--seed", type=int, default=SEED)
    args = parser.parse_args(argv)
    path = write(args.out, args.seed)
    print(f"wrote {path} ({path.stat().st_size / 1024:.0f} KB)")


if __name__ == "__main__":
    main()
