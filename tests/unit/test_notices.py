"""Interruption notices (entrypoint/notices.py) against a fake metadata server on 127.0.0.1 speaking AWS's
IMDSv2 and GCP's protocol: what counts as a notice, the settings, and the watcher's SIGTERM to its own
process. The whole path in a real `rentune run` (commit, exit 143, resume) is in
tests/integration/test_resume.py."""

from __future__ import annotations

import signal
import threading
import time

import pytest

from entrypoint.errors import InvalidInput
from entrypoint.notices import (
    AwsNotices,
    GcpNotices,
    detect_provider,
    notice_settings,
    notice_source,
    watching_notices,
)
from tests.metadata_server import FakeMetadata


def test_aws_no_notice_then_a_spot_notice_with_its_lead_time():
    with FakeMetadata() as fake:
        aws = AwsNotices(fake.url)
        assert aws.check() is None
        fake.raise_spot_notice(lead_seconds=120)
        notice = aws.check()
    assert notice is not None and notice.provider == "aws"
    assert notice.what.startswith("spot/instance-action: terminate at ")
    assert 110 <= notice.lead_seconds <= 121
    assert "(1" in notice.describe() and "s ahead)" in notice.describe()
    # IMDSv2: one token, every GET carried it
    assert [r for r in fake.requests if r[0] == "PUT"] == [("PUT", "/latest/api/token", True)]
    assert all(authorised for _, _, authorised in fake.requests)


def test_aws_maintenance_counts_only_when_it_is_near_and_active():
    with FakeMetadata() as fake:
        aws = AwsNotices(fake.url)
        aws.maintenance_every = 0.0  # read it at every check here (once a minute by default)
        fake.schedule_maintenance(in_seconds=2 * 86400)  # days ahead: training goes on
        fake.schedule_maintenance(in_seconds=60, state="canceled")
        fake.schedule_maintenance(in_seconds=60, state="completed")
        fake.schedule_maintenance(in_seconds=60, code="system-maintenance")  # the instance stays up
        assert aws.check() is None
        fake.schedule_maintenance(in_seconds=600, code="instance-stop")
        notice = aws.check()
    assert notice is not None and "instance-stop not before" in notice.what
    assert 500 <= notice.lead_seconds <= 601


def test_gcp_preemption_and_terminating_maintenance():
    with FakeMetadata() as fake:
        gcp = GcpNotices(fake.url)
        gcp.maintenance_every = 0.0
        assert gcp.check() is None
        fake.gcp_maintenance = "MIGRATE_ON_HOST_MAINTENANCE"  # a live migration: nothing to do
        assert gcp.check() is None
        fake.gcp_maintenance = "TERMINATE_ON_HOST_MAINTENANCE"
        assert "TERMINATE_ON_HOST_MAINTENANCE" in gcp.check().what
        fake.raise_gcp_preemption()
        notice = gcp.check()
    assert notice.what == "instance/preempted: TRUE" and notice.lead_seconds == 30
    assert all(authorised for _, _, authorised in fake.requests)  # Metadata-Flavor on every request


def test_detect_provider_from_dmi(tmp_path):
    no_uuid = tmp_path / "no-uuid"
    assert detect_provider(tmp_path / "missing", no_uuid) is None
    (tmp_path / "sys_vendor").write_text("Amazon EC2\n")
    assert detect_provider(tmp_path, no_uuid) == "aws"
    (tmp_path / "sys_vendor").write_text("Google\n")
    assert detect_provider(tmp_path, no_uuid) == "gcp"
    (tmp_path / "sys_vendor").write_text("QEMU\n")
    assert detect_provider(tmp_path, no_uuid) is None
    # an older Xen-based EC2 instance (p2, p3, g3): Xen everywhere but its BIOS version and hypervisor uuid
    (tmp_path / "sys_vendor").write_text("Xen\n")
    (tmp_path / "product_name").write_text("HVM domU\n")
    assert detect_provider(tmp_path, no_uuid) is None
    (tmp_path / "bios_version").write_text("4.11.amazon\n")
    assert detect_provider(tmp_path, no_uuid) == "aws"
    (tmp_path / "bios_version").unlink()
    (tmp_path / "uuid").write_text("ec2e1916-9099-7caf-fd21-012345abcdef\n")
    assert detect_provider(tmp_path, tmp_path / "uuid") == "aws"


def test_settings(tmp_path):
    no_uuid = tmp_path / "no-uuid"
    assert notice_source({"RENTUNE_INTERRUPTION_NOTICE": "off"}) is None
    assert notice_source({}, dmi=tmp_path, hypervisor=no_uuid) is None  # auto on a machine that is neither
    (tmp_path / "board_vendor").write_text("Amazon EC2")
    found = notice_source({}, dmi=tmp_path, hypervisor=no_uuid)
    assert isinstance(found, AwsNotices) and found.base == "http://169.254.169.254"
    found = notice_source({"RENTUNE_INTERRUPTION_NOTICE": "GCP", "RENTUNE_METADATA_URL": "http://127.0.0.1:9/"})
    assert isinstance(found, GcpNotices) and found.base == "http://127.0.0.1:9"
    with pytest.raises(InvalidInput, match=r"RENTUNE_INTERRUPTION_NOTICE='azure': expected one of auto, aws, gcp"):
        notice_source({"RENTUNE_INTERRUPTION_NOTICE": "azure"})
    with pytest.raises(InvalidInput, match=r"RENTUNE_METADATA_URL='file:///etc/passwd': expected an http://"):
        notice_source({"RENTUNE_INTERRUPTION_NOTICE": "aws", "RENTUNE_METADATA_URL": "file:///etc/passwd"})
    with pytest.raises(InvalidInput, match=r"RENTUNE_NOTICE_POLL_SECONDS='0': expected seconds between"):
        with watching_notices(print, {"RENTUNE_INTERRUPTION_NOTICE": "aws", "RENTUNE_NOTICE_POLL_SECONDS": "0"}):
            pass
    # checked whatever the mode, so that a typo shows on a laptop, not first in the cloud
    with pytest.raises(InvalidInput, match="RENTUNE_NOTICE_POLL_SECONDS='5s'"):
        notice_settings({"RENTUNE_INTERRUPTION_NOTICE": "off", "RENTUNE_NOTICE_POLL_SECONDS": "5s"})
    with pytest.raises(InvalidInput, match="RENTUNE_METADATA_URL='169.254.169.254'"):
        notice_settings({"RENTUNE_METADATA_URL": "169.254.169.254"})
    # an address the watcher could never reach is refused at start, not found out in the log
    with pytest.raises(InvalidInput, match=r"RENTUNE_METADATA_URL='http://': no host"):
        notice_settings({"RENTUNE_METADATA_URL": "http://"})
    with pytest.raises(InvalidInput, match=r"RENTUNE_METADATA_URL='http://\[::1': not a valid URL"):
        notice_settings({"RENTUNE_METADATA_URL": "http://[::1"})
    with pytest.raises(InvalidInput, match=r"'http://h:99999': not a valid URL \(Port out of range"):
        notice_settings({"RENTUNE_METADATA_URL": "http://h:99999"})
    with pytest.raises(InvalidInput, match=r"'ftp://h/\?token=REDACTED': expected an http://") as refused:
        notice_settings({"RENTUNE_METADATA_URL": "ftp://u:pw@h/?token=T0P"})
    assert "T0P" not in str(refused.value) and "pw" not in str(refused.value)
    assert notice_settings({"RENTUNE_METADATA_URL": "http://[::1]:8080/"}).metadata_url == "http://[::1]:8080/"
    assert notice_settings({}).interval == 5.0 and notice_settings({}).mode == "auto"


@pytest.fixture
def sigterm_caught():
    """SIGTERM to this process sets the event instead of ending it (restored afterwards)."""
    caught = threading.Event()
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: caught.set())
    yield caught
    signal.signal(signal.SIGTERM, previous)


def test_the_watcher_sends_sigterm_on_the_first_notice(sigterm_caught):
    lines: list[str] = []
    with FakeMetadata() as fake:
        env = {"RENTUNE_INTERRUPTION_NOTICE": "aws", "RENTUNE_METADATA_URL": fake.url}
        env["RENTUNE_NOTICE_POLL_SECONDS"] = "0.05"
        with watching_notices(lines.append, env) as seen:
            _wait_for(lambda: len(fake.requests) >= 5)
            assert not sigterm_caught.is_set() and not seen.is_set()
            # polling went on with no notice: one request per poll, the maintenance schedule once a minute
            paths = [path for _, path, _ in fake.requests]
            assert paths.count("/latest/meta-data/spot/instance-action") >= 3
            assert paths.count("/latest/meta-data/events/maintenance/scheduled") == 1
            assert paths.count("/latest/api/token") == 1
            fake.raise_spot_notice(lead_seconds=90)
            assert sigterm_caught.wait(5)
            assert seen.is_set()
        assert fake.first_served_at - fake.raised_at < 1.0
    assert lines[0] == f"notices: watching aws's interruption notices at {fake.url} every 0.05 s"
    assert lines[-1].startswith("notices: interruption notice from aws spot/instance-action: terminate at ")
    assert lines[-1].endswith("s ahead); stopping as on SIGTERM")


def _wait_for(condition, seconds: float = 10.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def test_an_endpoint_in_error_is_logged_once_and_polled_again(sigterm_caught):
    lines: list[str] = []
    with FakeMetadata() as fake:
        fake.failing = True  # HTTP 500 to everything
        env = {"RENTUNE_INTERRUPTION_NOTICE": "gcp", "RENTUNE_METADATA_URL": fake.url}
        env["RENTUNE_NOTICE_POLL_SECONDS"] = "0.05"
        with watching_notices(lines.append, env):
            _wait_for(lambda: len(fake.requests) >= 4)  # polled again after the failures
            assert len(lines) == 2 and "notices: cannot read gcp's metadata endpoint" in lines[1], lines
            fake.failing = False
            fake.raise_gcp_preemption()  # and a notice after the failures is still acted on
            assert sigterm_caught.wait(5)


def test_a_refused_connection_is_logged_once(sigterm_caught):
    lines: list[str] = []
    with FakeMetadata() as fake:
        url = fake.url
    env = {"RENTUNE_INTERRUPTION_NOTICE": "aws", "RENTUNE_METADATA_URL": url, "RENTUNE_NOTICE_POLL_SECONDS": "0.05"}
    with watching_notices(lines.append, env):
        time.sleep(0.3)
    assert len(lines) == 2 and "notices: cannot read aws's metadata endpoint" in lines[1], lines
    assert not sigterm_caught.is_set()


def test_no_sigterm_once_the_block_is_left(sigterm_caught, monkeypatch):
    """A check that returns its notice after the watch ended (a slow endpoint) sends nothing."""
    import entrypoint.notices as notices

    release = threading.Event()

    def slow_check(self):
        release.wait(10)
        return notices.Notice("aws", "spot/instance-action: terminate at soon", 100.0)

    monkeypatch.setattr(notices.AwsNotices, "check", slow_check)
    monkeypatch.setattr(notices, "TIMEOUT_SECONDS", 0.05)  # the exit does not wait for the thread
    env = {"RENTUNE_INTERRUPTION_NOTICE": "aws", "RENTUNE_METADATA_URL": "http://127.0.0.1:9"}
    with watching_notices(print, env) as seen:
        pass
    release.set()
    time.sleep(0.3)
    assert not sigterm_caught.is_set() and not seen.is_set()


def test_off_starts_no_thread():
    before = threading.active_count()
    with watching_notices(print, {"RENTUNE_INTERRUPTION_NOTICE": "off"}):
        assert threading.active_count() == before
