"""HostUnreachable carries the hosts it names from its constructor on: a restart reads them
to go on without those hosts (or wait for them), so no raiser may forget to set them."""

from __future__ import annotations

from zlaunch.errors import HostUnreachable, LaunchError


def test_the_hosts_are_given_when_it_is_made_and_render_stays_the_message():
    err = HostUnreachable("2 of 3 agents did not dial in", hosts=["b", "c"], hint="check TCP")
    assert err.hosts == ("b", "c") and isinstance(err, LaunchError)
    assert err.render() == "error: 2 of 3 agents did not dial in\n  hint: check TCP"
    assert HostUnreachable.of("a", "ssh to a timed out").hosts == ("a",)


def test_a_failure_that_is_no_one_host_s_names_none():
    assert HostUnreachable("cannot read known_hosts file ~/.ssh/known_hosts").hosts == ()
