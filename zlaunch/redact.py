"""What of a job's environment and arguments may be written down or shown (stdlib only).

Two rules, for two audiences:

* The run directory (``run.json``) outlives the job and is read by other tools and people, so
  it records environment *values* only for the names in :data:`RECORDED_ENV` and
  :data:`RECORDED_PREFIXES` (what zlaunch sets, and search paths and communication tuning);
  every other value is written as ``<not recorded>``. Names are always recorded.
* ``--dry-run`` shows the user their own plan, so it shows values, except those that look
  secret: a name holding TOKEN, SECRET, PASSWORD, PASSWD, PASS, PWD, KEY, PAT, AUTH, BEARER,
  CREDENTIAL, COOKIE, SESSION, SIGNATURE or PRIVATE (PAT as a word: GH_PAT, not PATH), a value that starts like a well-known
  token (``ghp_``, ``hf_``, ``sk-``, ``AKIA`` ...), and the password inside a URL
  (``postgres://user:<redacted>@host``).

Program arguments get the same treatment in both places: ``--api-token=X``, ``--password X``
(any flag whose name looks secret) and URL passwords are redacted.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from zlaunch import protocol

__all__ = [
    "REDACTED",
    "NOT_RECORDED",
    "RECORDED_ENV",
    "RECORDED_PREFIXES",
    "recorded_env_value",
    "shown_env_value",
    "redact_argv",
    "redact_text",
]

REDACTED = "<redacted>"
NOT_RECORDED = "<not recorded>"

# Values that may be written to the run directory: the names zlaunch sets for every worker,
# and paths and tuning that say where and how a job ran but never hold credentials.
RECORDED_ENV = protocol.JOB_ENV_NAMES | {"PATH", "LD_LIBRARY_PATH", "PYTHONPATH", "VIRTUAL_ENV"}
RECORDED_PREFIXES = ("NCCL_", "GLOO_", "OMP_")

_SECRET_NAME = re.compile(
    r"TOKEN|SECRET|PASSWORD|PASSWD|PASS|PWD|KEY|(?:^|[_-])PAT(?:$|[_-])|AUTH|BEARER|CREDENTIAL"
    r"|COOKIE|SESSION|SIGNATURE|PRIVATE",
    re.IGNORECASE,
)
# Well-known credential formats, whatever the variable or flag is called.
_SECRET_VALUE = re.compile(
    r"^(ghp_|gho_|ghu_|ghs_|ghr_|github_pat_|glpat-|hf_|sk-|sk_live_|rk_live_|xox[abposr]-"
    r"|AKIA|ASIA|AIza|ya29\.|eyJ[A-Za-z0-9_-]{8,}\.)"
)
# scheme://user:password@host -> the password part.
_URL_PASSWORD = re.compile(r"(?P<head>[A-Za-z][A-Za-z0-9+.-]*://[^/@:\s]*:)[^/@\s]+(?=@)")


def recorded_env_value(name: str, value: str) -> str:
    """The value run.json may hold for ``name``: the value if allow-listed, else a marker."""
    if name in RECORDED_ENV or name.startswith(RECORDED_PREFIXES):
        return value
    return NOT_RECORDED


def redact_text(value: str) -> str:
    """A value with the secrets it visibly holds removed (token formats, URL passwords)."""
    if _SECRET_VALUE.match(value):
        return REDACTED
    return _URL_PASSWORD.sub(lambda m: m.group("head") + REDACTED, value)


def shown_env_value(name: str, value: str) -> str:
    """The value --dry-run shows for ``name``."""
    if _SECRET_NAME.search(name):
        return REDACTED
    return redact_text(value)


def redact_argv(argv: Sequence[str]) -> list[str]:
    """Arguments with secret-looking option values and URL passwords redacted."""
    out: list[str] = []
    hide_next = False
    for arg in argv:
        if hide_next:
            out.append(REDACTED)
            hide_next = False
            continue
        flag, eq, value = arg.partition("=")
        is_flag = arg.startswith("-") and len(flag) > 1
        if is_flag and _SECRET_NAME.search(flag):
            if eq:
                out.append(f"{flag}={REDACTED}")
            else:
                out.append(arg)
                hide_next = True
            continue
        out.append(redact_text(arg))
    return out
