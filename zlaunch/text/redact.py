"""What of a job's environment and arguments may be written down or shown (stdlib only).

Two rules, for two audiences:

* The run directory (``run.json``) outlives the job and is read by other tools and people, so
  it records environment *values* only for the names in :data:`RECORDED_ENV` and
  :data:`RECORDED_PREFIXES` (what zlaunch sets, and search paths and communication tuning);
  every other value is written as ``<not recorded>``. Names are always recorded.
* ``--dry-run`` shows the user their own plan, so it shows values, except those that look
  secret: a name holding TOKEN, SECRET, PASSWORD, PASSWD, PASS, PWD, KEY, PAT, TOK, SIG, AUTH,
  BEARER, CREDENTIAL, COOKIE, SESSION, SIGNATURE or PRIVATE (PAT, TOK and SIG as words: GH_PAT,
  not PATH), and inside any value: a token of a well-known shape (``hf_`` and 30+ letters,
  ``ghp_``..., ``sk-``..., ``AKIA``..., a JWT, 32+ hex digits, 32+ random letters and digits),
  the password of a URL (``postgres://user:<redacted>@host``, a ``/`` or ``@`` in it too), the
  secret path of a Slack or Discord webhook, and secret-named ``name=value`` pairs
  (``AccountKey=`` of a connection string, ``sig=`` of a SAS URL).
* run.json applies the same rules on top of its allow-list: an allowed prefix does not make
  ``NCCL_IB_TOKEN`` safe to write.

Program arguments get the same treatment in both places: ``--api-token=X``, ``--password X``
(any flag whose name looks secret) and the value rules above. A script or config path
(``hf_trainer.py``) is never taken for a secret.

A command line zlaunch builds is seen by every user of its machine (``ps``) and by the
scheduler's records (Slurm's ``SubmitLine``), so nothing on one may look secret: where
:func:`redact_argv` would change an argument, the argument goes elsewhere, and zlaunch's own
``--env NAME=VALUE`` values are never shown on one whatever their name (``env_flags``).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from zlaunch.wire import protocol

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
    r"TOKEN|SECRET|PASSWORD|PASSWD|PASS|PWD|KEY|(?:^|[_-])(?:PAT|TOK|SIG)(?:$|[_-])|AUTH|BEARER"
    r"|CREDENTIAL|COOKIE|SESSION|SIGNATURE|PRIVATE",
    re.IGNORECASE,
)
# Well-known credential formats, matched by their shape (prefix, alphabet and length), never
# by a prefix alone: ``hf_trainer.py`` is a script, ``hf_`` + 34 letters is a token.
_TOKEN_SHAPES = (
    r"gh[pousr]_[A-Za-z0-9]{30,}",
    r"github_pat_[A-Za-z0-9_]{30,}",
    r"glpat-[A-Za-z0-9_-]{20,}",
    r"hf_[A-Za-z0-9]{30,}",
    r"sk-(?:proj-|ant-)?[A-Za-z0-9_-]{20,}",
    r"[sr]k_(?:live|test)_[A-Za-z0-9]{20,}",
    r"xox[abposr]-[A-Za-z0-9-]{10,}",
    r"(?:AKIA|ASIA)[A-Z0-9]{16}",
    r"AIza[A-Za-z0-9_-]{35}",
    r"ya29\.[A-Za-z0-9_.-]{20,}",
    r"eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]*",  # a JWT
    r"[0-9a-fA-F]{32,}",  # a hex key (``-t 3f9a...``): 128 bits or more
    # 32+ letters and digits of both cases, no separators: random, not a word or a name
    r"(?=[A-Za-z0-9]*[0-9])(?=[A-Za-z0-9]*[a-z])(?=[A-Za-z0-9]*[A-Z])[A-Za-z0-9]{32,}",
)
_TOKEN = re.compile(r"(?<![A-Za-z0-9_.-])(?:" + "|".join(_TOKEN_SHAPES) + r")(?![A-Za-z0-9_-])")
# scheme://user:password@host -> the password part; it may hold '/' or '@' itself, so it runs
# to the last '@' of the argument (over-hiding a path with an '@' is the safe side).
_URL_PASSWORD = re.compile(r"(?P<head>[A-Za-z][A-Za-z0-9+.-]*://[^/@:\s]*:)[^\s]+(?=@)")
# name=value inside a longer text: a connection string's AccountKey=...;, a URL's &sig=..., a
# list of them (srun's --export=ALL,HF_TOKEN=...: a comma ends a value where a name= follows)
_SECRET_PAIR = re.compile(
    r"(?P<name>[A-Za-z][A-Za-z0-9_.-]*)=(?P<value>(?:[^;&,\s]|,(?![A-Za-z_][A-Za-z0-9_.-]*=))+)"
)
# Webhook URLs carry their secret in the path.
_WEBHOOK = re.compile(
    r"(?P<head>https?://(?:hooks\.slack\.com/(?:services|workflows|triggers)/"
    r"|(?:[a-z]+\.)?discord(?:app)?\.com/api/webhooks/))[^\s?#]+"
)
# An argument with one of these endings names a file (a script, a config): never a secret.
_FILE_ENDINGS = (".py", ".sh", ".ipynb", ".yaml", ".yml", ".json", ".toml", ".cfg", ".txt")


def recorded_env_value(name: str, value: str) -> str:
    """The value run.json may hold for ``name``: the value if allow-listed (and not secret by
    name or content, as --dry-run decides), else a marker."""
    if name not in RECORDED_ENV and not name.startswith(RECORDED_PREFIXES):
        return NOT_RECORDED
    if name not in protocol.JOB_ENV_NAMES and _SECRET_NAME.search(name):
        return NOT_RECORDED  # NCCL_IB_TOKEN: an allowed prefix does not make a secret safe
    return redact_text(value)


def redact_text(value: str) -> str:
    """A value with the secrets it visibly holds removed: token shapes, URL passwords,
    webhook paths and secret-named ``name=value`` pairs inside it."""
    value = _URL_PASSWORD.sub(lambda m: m.group("head") + REDACTED, value)
    value = _WEBHOOK.sub(lambda m: m.group("head") + REDACTED, value)
    value = _SECRET_PAIR.sub(_pair, value)
    return _TOKEN.sub(REDACTED, value)


def _pair(match: re.Match[str]) -> str:
    if _SECRET_NAME.search(match.group("name")) or match.group("name").lower() == "sig":
        return f"{match.group('name')}={REDACTED}"
    return match.group(0)


def shown_env_value(name: str, value: str) -> str:
    """The value --dry-run shows for ``name``."""
    if name not in protocol.JOB_ENV_NAMES and _SECRET_NAME.search(name):
        return REDACTED
    return redact_text(value)


def redact_argv(argv: Sequence[str], env_flags: Sequence[str] = ()) -> list[str]:
    """Arguments with secret-looking option values and URL passwords redacted. The value of
    a flag in ``env_flags`` (``--env NAME=VALUE`` or ``--env=NAME=VALUE``) is hidden whatever
    its name: ``NAME=<redacted>``; a bare ``NAME`` (taken from the environment) is shown."""
    out: list[str] = []
    hide_next = False
    env_next = False
    for arg in argv:
        if hide_next:
            out.append(REDACTED)
            hide_next = False
            continue
        if env_next:
            out.append(_env_setting(arg))
            env_next = False
            continue
        if arg in env_flags:
            out.append(arg)
            env_next = True
            continue
        flag, eq, value = arg.partition("=")
        if eq and flag in env_flags:
            out.append(f"{flag}={_env_setting(value)}")
            continue
        is_flag = arg.startswith("-") and len(flag) > 1
        if is_flag and _SECRET_NAME.search(flag):
            if eq:
                out.append(f"{flag}={REDACTED}")
            else:
                out.append(arg)
                hide_next = True
            continue
        if not is_flag and "://" not in arg and arg.endswith(_FILE_ENDINGS):
            out.append(arg)  # a script or config path (hf_trainer.py) is never a secret
            continue
        out.append(redact_text(arg))
    return out


def _env_setting(setting: str) -> str:
    name, eq, _ = setting.partition("=")
    return f"{name}={REDACTED}" if eq else setting
