"""`idlegpu submit / queue / cancel / admission --server URL`: the same commands through the
job API.

The local commands write the store with the caller's own config; these ask `idlegpu serve`,
which validates with the server's config and decides team, role and time itself. Output looks
like the local commands'; everything the user or the server wrote is printed as plain text,
never as markup.
"""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

import typer
from rich.console import Console
from rich.markup import escape

from idlegpu.scheduler.adapters.api_client import (
    ApiClient,
    ApiUnavailable,
    find_credential,
    read_request_text,
)
from idlegpu.scheduler.output import PLAN_START_COLUMNS, PLAN_WAIT_COLUMNS, Column, emit


def client_for(server: str, token_file: Path | None) -> ApiClient:
    return ApiClient(server, find_credential(token_file))


def _unavailable(console: Console, exc: ApiUnavailable, what: str) -> typer.Exit:
    console.print(f"[bold red]error:[/] {escape(str(exc))}; {what}", highlight=False,
                  soft_wrap=True)
    return typer.Exit(1)


def remote_submit(console: Console, err: Console, server: str, token_file: Path | None,
                  file: Path, idempotency_key: str | None) -> None:
    client = client_for(server, token_file)
    text = read_request_text(file)
    try:
        created, request = client.submit(text, idempotency_key=idempotency_key)
    except ApiUnavailable as exc:
        hint = ("nothing is queued twice if you submit again with the same --idempotency-key"
                if idempotency_key else
                "submit again with --idempotency-key KEY (and the same KEY on every retry) to "
                "be sure it is queued once; `idlegpu queue --server ...` shows what is queued")
        raise _unavailable(err, exc, hint) from None
    name, rid, team = escape(request["name"]), escape(request["id"]), escape(request["team"])
    if not created:
        console.print(f"{name} was already submitted as {rid} (same --idempotency-key); "
                      "nothing queued", highlight=False)
        return
    units = request.get("units", [])
    steps = len({u["step_index"] for u in units})
    gpus = max((u["gpus"] for u in units), default=0)
    console.print(
        f"queued {name} (team {team}, by {escape(str(request.get('submitted_by') or '?'))}) "
        f"as {rid}: {len(units)} unit(s) in {steps} step(s), up to {gpus} GPUs each; "
        f"`idlegpu queue --server {escape(client.server)}` shows them, "
        f"`idlegpu cancel --server {escape(client.server)} {rid}` withdraws them",
        highlight=False, soft_wrap=True)


def remote_queue(console: Console, err: Console, server: str, token_file: Path | None,
                 scope: str, all_units: bool, tz, output: str = "table") -> None:
    client = client_for(server, token_file)
    try:
        answer = client.units(scope=scope, states=["all"] if all_units else None)
    except ApiUnavailable as exc:
        raise _unavailable(err, exc, "nothing was changed") from None
    rows = answer.get("units", [])
    if not rows and output in ("table", "wide"):
        console.print(f"the queue is empty for scope {escape(scope)}"
                      + ("" if all_units else " (--all shows ended units)"), highlight=False)
        return
    listed = []
    for row in rows:
        state = row["state"]
        if row.get("cancel_requested_at") and state in ("admitted", "running"):
            state += " (stopping)"
        elif row.get("reason") and state in ("succeeded", "failed", "cancelled"):
            state += f": {row['reason']}"
        listed.append({
            "unit": row["id"], "request": row.get("request_id"), "team": row["team"],
            "step": f"{row['step']}[{row['member']}]" if row.get("member") else row["step"],
            "gpus": row["gpus"], "state": state, "attempts": row["attempts"],
            "preemptions": row["preemptions"],
            "tries": f"{row['attempts']}/{row['preemptions']}",
            "submitted": datetime.fromisoformat(row["submitted_at"])})
    columns = [Column("unit", "unit", identifier=True),
               Column("request", "request", identifier=True, wide_only=True),
               Column("team", "team"), Column("step", "step", wide_only=True),
               Column("gpus", "GPUs", right=True), Column("state", "state"),
               Column("tries", "tries", right=True), Column("submitted", "submitted")]
    if output not in ("table", "wide"):
        columns = [c for c in columns if c.key != "tries"] + [Column("attempts", "attempts"),
                                                               Column("preemptions",
                                                                      "preemptions")]
    emit(console, listed, columns, output, tz=tz,
         title=f"job queue, scope {scope} ({len(rows)} unit(s))")


def remote_cancel(console: Console, err: Console, server: str, token_file: Path | None,
                  target: str, reason: str | None) -> None:
    client = client_for(server, token_file)
    try:
        result = client.cancel(target, reason=reason)
    except ApiUnavailable as exc:
        raise _unavailable(err, exc, "cancel again when the API answers (cancelling twice "
                                     "changes nothing)") from None
    cancelled, to_stop = result.get("cancelled", []), result.get("to_stop", [])
    if cancelled:
        console.print(f"cancelled {len(cancelled)} queued unit(s): "
                      + escape(", ".join(cancelled)), highlight=False, soft_wrap=True)
    if to_stop:
        console.print(f"{len(to_stop)} unit(s) hold GPUs and will be stopped by the admission "
                      "daemon: " + escape(", ".join(to_stop)), highlight=False, soft_wrap=True)
    if not cancelled and not to_stop:
        console.print(f"nothing to cancel: every unit of {escape(target)} has already ended",
                      highlight=False)


def remote_plan(console: Console, err: Console, server: str, token_file: Path | None,
                hours: float) -> None:
    """`idlegpu plan --server URL`: the server's plan (its history, queue and clock)."""
    client = client_for(server, token_file)
    try:
        answer = client.plan(hours=hours)
    except ApiUnavailable as exc:
        raise _unavailable(err, exc, "no plan is shown without a fresh forecast") from None

    def at(text: str | None, fmt: str = "%a %H:%M") -> str:
        return datetime.fromisoformat(text).strftime(fmt) if text else "-"

    for line in answer.get("warnings", []):
        err.print(f"[yellow]warning:[/] {escape(line)}", highlight=False, soft_wrap=True)
    age = float(answer.get("forecast_age_s") or 0) / 60
    console.print(
        f"[bold]Plan from {at(answer['start'], '%a %Y-%m-%d %H:%M')} "
        f"({escape(answer['timezone'])})[/], free GPUs promised with "
        f"{answer['confidence']:.0%} confidence; forecast made at "
        f"{at(answer['made_at'], '%a %H:%M')} ({age:.0f} min ago); queue and forecast: "
        f"{escape(client.server)}", highlight=False, soft_wrap=True)
    windows = answer.get("windows", [])
    if windows:
        best = max(windows, key=lambda w: w["gpus"] * w["hours"])
        console.print(f"largest idle window: {best['gpus']} GPUs from {at(best['start'])} to "
                      f"{at(best['end'])} ({best['hours']:.1f} h)", highlight=False)
    units = answer.get("units", [])
    starts = [u for u in units if u["start_at"]]
    # the local plan's tables (idlegpu.scheduler.output), not a look of their own
    emit(console, [{"job": u["id"], "team": u["team"], "kind": u["kind"], "gpus": u["gpus"],
                    "from": at(u["start_at"]), "until": at(u["end_at"]),
                    "then": u.get("outcome") or ""} for u in starts],
         PLAN_START_COLUMNS, "table", title="Jobs that start")
    waits = [u for u in units if not u["start_at"]]
    if waits:
        emit(console, [{"job": u["id"], "gpus": u["gpus"], "why": u["reason"] or ""}
                       for u in waits], PLAN_WAIT_COLUMNS, "table", title="Jobs that wait, and why")
    harvest = sum(u["gpus"] * (datetime.fromisoformat(u["end_at"])
                               - datetime.fromisoformat(u["start_at"])).total_seconds() / 3600
                  for u in starts if u["end_at"])
    console.print(f"[bold green]{len(starts)} job unit(s) start, {harvest:,.0f} GPU-hours "
                  f"planned;[/] {len(waits)} wait.", highlight=False)


def remote_admission(console: Console, err: Console, server: str, token_file: Path | None,
                     action: str, reason: str | None = None) -> None:
    """`idlegpu admission status|pause|resume --server URL`: through the job API (pausing and
    resuming are the server's operators' and audited there)."""
    client = client_for(server, token_file)
    try:
        if action == "pause":
            answer = client.pause_admission(reason or "")
        elif action == "resume":
            answer = client.resume_admission()
        else:
            answer = client.admission()
    except ApiUnavailable as exc:
        raise _unavailable(err, exc, "nothing was changed" if action == "status" else
                           f"run `idlegpu admission {action}` again when the API answers "
                           "(doing it twice changes nothing)") from None
    print_admission(console, answer["paused"], answer["text"], action,
                    answer.get("changed", True), answer.get("message"), client.server)


def print_admission(console: Console, paused: bool, text: str, action: str, changed: bool,
                    message: str | None, where: str) -> None:
    """The admission state as `idlegpu admission` prints it, local or remote."""
    if action != "status" and not changed:
        console.print(f"[yellow]{escape(message or 'nothing changed')}[/]", highlight=False,
                      soft_wrap=True)
    style = "bold red" if paused else "bold green"
    console.print(f"[{style}]{escape(text)}[/] ({escape(where)})", highlight=False,
                  soft_wrap=True)
    if paused:
        console.print("the daemon admits no unit from its next reconcile pass; stops, the "
                      "backstop and planned stops go on; `idlegpu admission resume` resumes",
                      highlight=False, soft_wrap=True)


__all__ = ["print_admission", "remote_admission", "remote_cancel", "remote_plan",
           "remote_queue", "remote_submit"]
