"""What a user can do, one function each, whatever the front door: the CLI (``idlegpu
submit``, ``cancel``, ``admission``), the job API's routes and the web console's forms all
call these with the caller's identity as a value (``identity.Identity``), so that a request
is checked, stored, audited and made idempotent by one rule.

* ``submissions``: parse a request body, submit, validate (a dry run), cancel;
* ``operations``: pause and resume admission, the daemon's status;
* ``identity``: the caller, the roles, the audit entry of a change;
* ``errors``: what a refusal says (a status, a one-line message, the field), for every front
  door to render its own way.
"""
