"""Every parser, fed anything, raises only the project's own error, naming the
file and line (or the option), in bounded memory; a few random bad inputs go through the real
``zlaunch`` command too. Bounded example counts keep the whole file to well under a minute."""

from __future__ import annotations

from hypothesis import HealthCheck, assume, given, settings

from tests.integration.commands.hostile_input import assert_usage_error, write_script, zlaunch
from tests.unit.job.test_parser_properties import GRAMMAR_TEXT  # shared with the unit half
from zlaunch.errors import HostfileError
from zlaunch.job.hostfile import parse_hostfile

# Text that looks like the grammar as often as not: its tokens, digits of every script, and
# anything else.


# ---------------------------------------------------------------- checkpoint manifests


# ---------------------------------------------------------------- config (public function only)


# ---------------------------------------------------------------- through the real command
@settings(max_examples=12, deadline=None, suppress_health_check=list(HealthCheck))
@given(GRAMMAR_TEXT.filter(lambda t: "slots=" not in t or "\x00" in t))
def test_zlaunch_on_a_random_bad_hostfile_exits_2_with_one_message(tmp_path_factory, text):
    tmp = tmp_path_factory.mktemp("cli")
    try:
        parse_hostfile(text, origin="x")
    except HostfileError:
        pass
    else:
        assume(False)  # a valid hostfile: nothing to check here
    (tmp / "hosts").write_bytes(text.encode("utf-8", "surrogatepass"))
    script = write_script(tmp, "w.py", "pass\n")
    result = zlaunch(tmp, "--dry-run", "--hostfile", "hosts", script, timeout=60)
    err = assert_usage_error(result, "hosts")
    assert err.count("error:") == 1
