"""`idlegpu submit / queue / cancel --server URL`: the same commands through the job API.

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
from rich.table import Table

from scheduler.adapters.api_client import (
    ApiClient,
    ApiUnavailable,
    find_credential,
    read_request_text,
)


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
                 scope: str, all_units: bool, tz) -> None:
    client = client_for(server, token_file)
    try:
        answer = client.units(scope=scope, states=["all"] if all_units else None)
    except ApiUnavailable as exc:
        raise _unavailable(err, exc, "nothing was changed") from None
    rows = answer.get("units", [])
    if not rows:
        console.print(f"the queue is empty for scope {escape(scope)}"
                      + ("" if all_units else " (--all shows ended units)"), highlight=False)
        return
    table = Table(title=f"job queue, scope {escape(scope)} ({len(rows)} unit(s))",
                  title_justify="left")
    for column, justify in (("unit", "left"), ("team", "left"), ("step", "left"),
                            ("GPUs", "right"), ("state", "left"), ("tries", "right"),
                            ("submitted", "left")):
        table.add_column(column, justify=justify, overflow="fold")
    for row in rows:
        state = row["state"]
        if row.get("cancel_requested_at") and state in ("admitted", "running"):
            state += " (stopping)"
        elif row.get("reason") and state in ("succeeded", "failed", "cancelled"):
            state += f": {row['reason']}"
        step = f"{row['step']}[{row['member']}]" if row.get("member") else row["step"]
        submitted = datetime.fromisoformat(row["submitted_at"]).astimezone(tz)
        table.add_row(escape(row["id"]), escape(row["team"]), escape(step), str(row["gpus"]),
                      escape(state), f"{row['attempts']}/{row['preemptions']}",
                      submitted.strftime("%Y-%m-%d %H:%M %z"))
    console.print(table)


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


__all__ = ["remote_cancel", "remote_queue", "remote_submit"]
