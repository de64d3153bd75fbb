"""Interruption notices: the cloud provider says, on the instance's metadata endpoint, that it will reclaim
the machine soon. rentune then does what it does on SIGTERM (training finishes its step, commits a
checkpoint and the process exits 143), before the SIGKILL that may follow the notice without a SIGTERM.

    AWS  IMDSv2 (a session token, then GETs)           lead time
         /latest/meta-data/spot/instance-action        about 2 minutes: a spot instance is reclaimed
         /latest/meta-data/events/maintenance/scheduled   days ahead: acted on MAINTENANCE_LEAD before it
    GCP  /computeMetadata/v1/instance/preempted         about 30 s: TRUE once a spot VM is being preempted
         /computeMetadata/v1/instance/maintenance-event TERMINATE_ON_HOST_MAINTENANCE

A watcher thread polls beside the job, in a thread of its own that training steps never wait for (one
request every POLL_SECONDS, the maintenance schedule once a minute). On the first notice it sends SIGTERM
to this process and logs the notice with its lead time. AWS maintenance counts only for events that take
the instance down (reboot, stop, retirement), not system-maintenance. Set by
RENTUNE_INTERRUPTION_NOTICE: auto (the default: AWS or GCP when the machine's DMI data names it, else
nothing), aws, gcp, or off. RENTUNE_METADATA_URL replaces the endpoint's address (a proxy, or a test's
server); RENTUNE_NOTICE_POLL_SECONDS the interval. No torch, no boto3: urllib with short timeouts, no proxy.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timezone
from email.utils import parsedate_to_datetime
from pathlib import Path

from entrypoint.errors import InvalidInput
from jobspec.urls import redact

__all__ = [
    "Notice",
    "NoticeSettings",
    "detect_provider",
    "notice_provider",
    "notice_settings",
    "notice_source",
    "watching_notices",
]

MODES = ("auto", "aws", "gcp", "off")
ENDPOINTS = {"aws": "http://169.254.169.254", "gcp": "http://metadata.google.internal"}
POLL_SECONDS = 5.0
TIMEOUT_SECONDS = 2.0
MAINTENANCE_LEAD = 15 * 60.0  # a scheduled maintenance is acted on this long before it starts
MAINTENANCE_EVERY = 60.0  # maintenance is announced days ahead: read once a minute, the spot notice every poll
DMI = Path("/sys/class/dmi/id")
HYPERVISOR_UUID = Path("/sys/hypervisor/uuid")
# AWS scheduled events that take the instance down; system-maintenance (network, power) does not.
AWS_STOPPING_EVENTS = ("instance-reboot", "system-reboot", "instance-retirement", "instance-stop")


@dataclass(frozen=True)
class Notice:
    provider: str
    what: str  # e.g. "spot/instance-action: terminate at 2026-12-07T10:00:00Z"
    lead_seconds: float | None  # until the provider acts, where it says; None where it does not

    def describe(self) -> str:
        lead = f"{self.lead_seconds:.0f} s ahead" if self.lead_seconds is not None else "lead time not given"
        return f"{self.provider} {self.what} ({lead})"


# -- where we run -------------------------------------------------------------------------------------------
def detect_provider(dmi: Path = DMI, hypervisor: Path = HYPERVISOR_UUID) -> str | None:
    """aws or gcp from the machine's DMI data (readable in containers too), else None. Nitro instances say
    "Amazon EC2"; older Xen ones (p2, p3, g3) say Xen everywhere but in bios_version ("4.11.amazon") and
    a hypervisor uuid starting with "ec2"."""

    def read(path: Path) -> str:
        try:
            return path.read_text().strip()
        except OSError:
            return ""

    vendors = {read(dmi / name) for name in ("sys_vendor", "board_vendor", "bios_vendor", "product_name")}
    if any(v.startswith("Amazon EC2") for v in vendors):
        return "aws"
    if read(dmi / "bios_version").lower().endswith("amazon") or read(hypervisor).lower().startswith("ec2"):
        return "aws"
    if any(v.startswith(("Google", "Google Compute Engine")) for v in vendors):
        return "gcp"
    return None


def _mode(environ) -> str:
    mode = environ.get("RENTUNE_INTERRUPTION_NOTICE", "auto").strip().lower() or "auto"
    if mode not in MODES:
        given = environ["RENTUNE_INTERRUPTION_NOTICE"]
        raise InvalidInput(f"RENTUNE_INTERRUPTION_NOTICE={given!r}: expected one of {', '.join(MODES)}")
    return mode


def _poll_seconds(environ) -> float:
    text = environ.get("RENTUNE_NOTICE_POLL_SECONDS")
    if not text:
        return POLL_SECONDS
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0.05 <= value <= 3600:
        raise InvalidInput(f"RENTUNE_NOTICE_POLL_SECONDS={text!r}: expected seconds between 0.05 and 3600")
    return value


# -- the providers' endpoints -------------------------------------------------------------------------------
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # the endpoint is link-local: no proxy


def _request(url: str, method: str = "GET", headers: dict | None = None) -> tuple[int, str]:
    """(status, body); 404 is an answer (no notice), not an error. Raises OSError when unreachable."""
    request = urllib.request.Request(url, method=method, headers=headers or {})  # noqa: S310 (http only: notice_source)
    try:
        with _OPENER.open(request, timeout=TIMEOUT_SECONDS) as response:
            return response.status, response.read().decode("utf-8", "replace")
    except urllib.error.HTTPError as exc:
        return exc.code, ""


def _seconds_until(moment: datetime, now: float) -> float:
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=timezone.utc)
    return moment.timestamp() - now


class AwsNotices:
    """EC2's instance metadata service, version 2: a session token (PUT), then GETs that carry it."""

    TOKEN_TTL = 21600

    def __init__(self, base: str, clock: Callable[[], float] = time.time):
        self.base = base.rstrip("/")
        self.clock = clock
        self._token: str | None = None
        self._token_until = 0.0
        self.maintenance_every = MAINTENANCE_EVERY
        self._maintenance_read = -float("inf")

    def _get(self, path: str) -> tuple[int, str]:
        if self._token is None or time.monotonic() > self._token_until:
            status, body = _request(
                f"{self.base}/latest/api/token", "PUT", {"X-aws-ec2-metadata-token-ttl-seconds": str(self.TOKEN_TTL)}
            )
            if status != 200:
                raise OSError(f"IMDSv2 token: HTTP {status}")
            self._token, self._token_until = body.strip(), time.monotonic() + self.TOKEN_TTL / 2
        status, body = _request(
            f"{self.base}/latest/meta-data/{path}", headers={"X-aws-ec2-metadata-token": self._token}
        )
        if status == 401:  # the token expired early (a restarted metadata service): fetch another next time
            self._token = None
        return status, body

    def check(self) -> Notice | None:
        status, body = self._get("spot/instance-action")
        if status == 200 and body.strip():
            action = json.loads(body)
            at = action.get("time", "")
            lead = _seconds_until(datetime.fromisoformat(at.replace("Z", "+00:00")), self.clock()) if at else None
            return Notice("aws", f"spot/instance-action: {action.get('action', '?')} at {at or '?'}", lead)
        if time.monotonic() - self._maintenance_read < self.maintenance_every:
            return None
        self._maintenance_read = time.monotonic()
        status, body = self._get("events/maintenance/scheduled")
        if status == 200 and body.strip():
            for event in json.loads(body):
                if not isinstance(event, dict) or event.get("State", "active") != "active":
                    continue
                if event.get("Code") not in AWS_STOPPING_EVENTS or not event.get("NotBefore"):
                    continue
                lead = _seconds_until(parsedate_to_datetime(event["NotBefore"]), self.clock())
                if lead <= MAINTENANCE_LEAD:
                    what = f"events/maintenance/scheduled: {event.get('Code', '?')} not before {event['NotBefore']}"
                    return Notice("aws", what, lead)
        return None


class GcpNotices:
    """Compute Engine's metadata server (the Metadata-Flavor header is required)."""

    LEAD = 30.0  # GCP's documented preemption notice; the endpoint itself gives no time

    def __init__(self, base: str):
        self.base = base.rstrip("/")
        self.maintenance_every = MAINTENANCE_EVERY
        self._maintenance_read = -float("inf")

    def _get(self, path: str) -> str:
        status, body = _request(
            f"{self.base}/computeMetadata/v1/instance/{path}", headers={"Metadata-Flavor": "Google"}
        )
        if status != 200:
            raise OSError(f"{path}: HTTP {status}")
        return body.strip()

    def check(self) -> Notice | None:
        if self._get("preempted").upper() == "TRUE":
            return Notice("gcp", "instance/preempted: TRUE", self.LEAD)
        if time.monotonic() - self._maintenance_read < self.maintenance_every:
            return None
        self._maintenance_read = time.monotonic()
        event = self._get("maintenance-event")
        if event.upper().startswith("TERMINATE"):
            return Notice("gcp", f"instance/maintenance-event: {event}", None)
        return None


@dataclass(frozen=True)
class NoticeSettings:
    mode: str  # auto, aws, gcp or off
    metadata_url: str | None  # RENTUNE_METADATA_URL, else the provider's own address
    interval: float


def notice_settings(environ=os.environ) -> NoticeSettings:
    """The three variables, checked whatever the mode (a typo shows on a laptop too, not only in the
    cloud): InvalidInput (exit 2) naming the variable. `rentune run` and `rentune worker` call it at start,
    before a job or claim exists."""
    url = environ.get("RENTUNE_METADATA_URL") or None
    if url is not None:
        _check_metadata_url(url)
    return NoticeSettings(_mode(environ), url, _poll_seconds(environ))


def _check_metadata_url(url: str) -> None:
    """An http:// address with a host (the metadata services speak plain HTTP): InvalidInput otherwise,
    saying what is wrong (the value redacted: it may hold a password)."""
    shown = f"RENTUNE_METADATA_URL={redact(url)!r}"
    if not url.startswith("http://"):
        raise InvalidInput(f"{shown}: expected an http:// address, such as http://169.254.169.254")
    try:
        parts = urllib.parse.urlsplit(url)
        parts.port  # noqa: B018 - raises ValueError on a port that is not a number in range
    except ValueError as exc:
        raise InvalidInput(f"{shown}: not a valid URL ({exc}); expected http://HOST[:PORT]") from None
    if not parts.hostname:
        raise InvalidInput(f"{shown}: no host; expected http://HOST[:PORT], such as http://169.254.169.254")


def notice_provider(environ=os.environ, dmi: Path = DMI, hypervisor: Path = HYPERVISOR_UUID) -> str | None:
    """The provider whose notices this process watches ("aws", "gcp"), or None: what the plan's notice window
    is measured against (its lead time, jobspec.plan.NOTICE_SECONDS). Raises InvalidInput on a bad setting."""
    settings = notice_settings(environ)
    if settings.mode == "off":
        return None
    return detect_provider(dmi, hypervisor) if settings.mode == "auto" else settings.mode


def notice_source(environ=os.environ, dmi: Path = DMI, hypervisor: Path = HYPERVISOR_UUID):
    """The endpoint to poll for this process (AwsNotices or GcpNotices), or None: off, or auto on a machine
    that is neither. Raises InvalidInput on a bad setting (notice_settings)."""
    provider = notice_provider(environ, dmi, hypervisor)
    if provider is None:
        return None
    base = notice_settings(environ).metadata_url or ENDPOINTS[provider]
    return AwsNotices(base) if provider == "aws" else GcpNotices(base)


# -- the watcher ----------------------------------------------------------------------------------------------
@contextmanager
def watching_notices(log: Callable[[str], None], environ=os.environ) -> Iterator[threading.Event]:
    """While active, a daemon thread polls the provider's notices; on the first one it sends SIGTERM to this
    process, then logs the notice (SIGTERM first: the log may write to the store, which can take seconds of
    the notice's lead). Yields an Event set once a notice was acted on. Errors reading the endpoint are
    logged once and polled again (the metadata service can be briefly unavailable). Once the block is left,
    no SIGTERM comes from it: the thread checks, under a lock the exit takes too, that it may still act."""
    source = notice_source(environ)
    seen, stop, acting = threading.Event(), threading.Event(), threading.Lock()
    if source is None:
        yield seen
        return
    interval = notice_settings(environ).interval
    provider = "aws" if isinstance(source, AwsNotices) else "gcp"
    log(f"notices: watching {provider}'s interruption notices at {source.base} every {interval:g} s")

    def say(line: str) -> None:
        try:
            log(line)
        except Exception:  # noqa: BLE001, S110 (the log is the watcher's least concern; the stop goes on)
            pass

    def poll() -> None:
        failing = False
        while not stop.is_set():
            try:
                notice = source.check()
            except Exception as exc:  # noqa: BLE001 (unreachable, or an answer it cannot read: never die)
                if not failing:
                    problem = f"{type(exc).__name__}: {exc}"
                    say(f"notices: cannot read {provider}'s metadata endpoint ({problem}); still polling")
                failing, notice = True, None
            else:
                failing = False
            if notice is not None:
                with acting:
                    if stop.is_set():
                        return
                    seen.set()
                    os.kill(os.getpid(), signal.SIGTERM)
                say(f"notices: interruption notice from {notice.describe()}; stopping as on SIGTERM")
                return
            stop.wait(interval)

    thread = threading.Thread(target=poll, name="rentune-notices", daemon=True)
    thread.start()
    try:
        yield seen
    finally:
        with acting:
            stop.set()
        thread.join(timeout=TIMEOUT_SECONDS * 3)
