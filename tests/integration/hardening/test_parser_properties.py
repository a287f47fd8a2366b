"""Issue 13 item 6: every parser, fed anything, raises only the project's own error, naming the
file and line (or the option), in bounded memory; a few random bad inputs go through the real
``zlaunch`` command too. Bounded example counts keep the whole file to well under a minute."""

from __future__ import annotations

from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from tests.integration.hardening.helpers import assert_usage_error, write_script, zlaunch
from zlaunch.errors import HostfileError
from zlaunch.hostfile import parse_hostfile

# Text that looks like the grammar as often as not: its tokens, digits of every script, and
# anything else.
TOKENS = st.sampled_from(
    ["node1", "node2", "slots=", "port=", "user=", "=", "@", ":", ",", "-", "[", "]", "#", " ",
     "\n", "\t", "export ", '"', "'", "\\", "²", "٣", "9" * 30, "::1", "a:22", "\x00", "\r\n",
     "KEY", "localhost", "0", "1", "2-3", "%eth0", "\u2028"]
)  # fmt: skip
GRAMMAR_TEXT = st.lists(st.one_of(TOKENS, st.text(max_size=8)), max_size=40).map("".join)


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
