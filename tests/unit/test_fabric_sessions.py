"""fabric-test's SSH sessions: sshd refuses a session beyond its MaxSessions (ChannelException 2, "Connect
failed") while the channels of the round before are still closing; the session is asked for again, and a
refusal that lasts is one clear error."""

import paramiko
import pytest

from opsctl.errors import SourceUnavailable
from opsctl.fabric.fabrictest import open_session


class Transport:
    def __init__(self, refusals: int):
        self.refusals = refusals
        self.asked = 0

    def open_session(self):
        self.asked += 1
        if self.asked <= self.refusals:
            raise paramiko.ChannelException(2, "Connect failed")
        return "channel"


def test_a_refused_session_is_asked_for_again():
    transport = Transport(refusals=3)
    assert open_session(transport, "gpu1", sleep=lambda _s: None) == "channel"
    assert transport.asked == 4


def test_a_lasting_refusal_is_one_error_naming_the_host():
    with pytest.raises(SourceUnavailable, match="gpu1: sshd refused another session"):
        open_session(Transport(refusals=10**6), "gpu1", retry_seconds=0.2)
