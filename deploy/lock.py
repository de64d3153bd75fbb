"""The images' Python dependencies, pinned to the versions the test suite passed with, each with its sha256.

    python deploy/lock.py write deploy/requirements.lock      (make lock) from the environment this python runs in
    python deploy/lock.py check deploy/requirements.lock      installed == locked, and every dependency met
    python deploy/lock.py constraints deploy/requirements.lock   the pins alone, as a pip constraints file

`write` starts from pyproject.toml's dependencies and the extras the images install (IMAGE_EXTRAS), follows
each requirement, with its markers and extras, through the distributions installed here, and pins the
version installed here: the lock says what `make test` ran, not what an index would resolve today. torch,
and what only torch needs, stay out: the base image provides them (Dockerfile.cuda, Dockerfile.rocm). The
hashes are every Linux or pure-Python file of that version on the index (PyPI's simple JSON API), so a
build on another Linux machine or CPU finds its wheel. The images install the lock with
`pip install --require-hashes --no-deps`, then run `check`, which fails the build when an installed version
differs from the lock or a locked package's dependency is missing (another Python can need other ones).

Only the standard library and `packaging` (pip's own copy where packaging is not installed): this runs in
an image before anything is installed.
"""

from __future__ import annotations

import hashlib
import json
import re
import sys
import urllib.request
from importlib import metadata
from pathlib import Path

try:
    import tomllib
except ImportError:  # Python 3.10: the TOML reader pip itself uses
    from pip._vendor import tomli as tomllib

try:
    from packaging.markers import default_environment
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name
    from packaging.version import Version
except ImportError:  # a bare image: pip's vendored copy
    from pip._vendor.packaging.markers import default_environment
    from pip._vendor.packaging.requirements import Requirement
    from pip._vendor.packaging.utils import canonicalize_name
    from pip._vendor.packaging.version import Version

IMAGE_EXTRAS = ("distributed", "tracking", "qlora")
PROVIDED = {"torch"}  # by the base image, with everything only it needs
INDEX = "https://pypi.org/simple"
PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+)")
# Files no Linux image installs.
NOT_LINUX = re.compile(r"(win32|win_amd64|win_arm64|macosx|\.exe$|\.msi$|\.dmg$|\.egg$|ios_|android_)")


def image_requirements(pyproject: Path, extras: tuple[str, ...] = IMAGE_EXTRAS) -> list[str]:
    """pyproject.toml's dependencies plus those of `extras`."""
    project = tomllib.loads(pyproject.read_text())["project"]
    found = list(project["dependencies"])
    for extra in extras:
        if extra not in project.get("optional-dependencies", {}):
            raise SystemExit(f"{pyproject}: no optional dependency group [{extra}]")
        found += project["optional-dependencies"][extra]
    return found


def _applies(requirement: Requirement, extras: set[str]) -> bool:
    if requirement.marker is None:
        return True
    return any(requirement.marker.evaluate({**default_environment(), "extra": e}) for e in extras | {""})


def installed_closure(roots: list[str]) -> dict[str, str]:
    """{canonical name: version installed here} of `roots` and everything they need here, torch's own
    needs left out. Raises SystemExit naming a requirement that is not installed or not satisfied."""
    pins: dict[str, str] = {}
    extras_seen: dict[str, set[str]] = {}
    pending = [(Requirement(text), "pyproject.toml") for text in roots]
    while pending:
        requirement, wanted_by = pending.pop()
        name = canonicalize_name(requirement.name)
        if name in PROVIDED or not _applies(requirement, {""}):
            continue
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            raise SystemExit(f"{requirement} (needed by {wanted_by}) is not installed here; run make setup") from None
        if not requirement.specifier.contains(dist.version, prereleases=True):
            raise SystemExit(f"{requirement} (needed by {wanted_by}): {dist.version} is installed here")
        extras = set(requirement.extras)
        if name in pins and extras <= extras_seen[name]:
            continue
        pins[name] = dist.version
        extras_seen[name] = extras_seen.get(name, set()) | extras
        for text in dist.requires or []:
            needed = Requirement(text)
            if _applies(needed, extras_seen[name]):
                needed.marker = None
                pending.append((needed, f"{name}=={dist.version}"))
    return pins


def _hashes(name: str, version: str, index: str = INDEX) -> list[str]:
    """sha256 of every Linux or pure-Python file of name==version on the index."""
    request = urllib.request.Request(  # noqa: S310 (https, a fixed index)
        f"{index}/{name}/", headers={"Accept": "application/vnd.pypi.simple.v1+json"}
    )
    with urllib.request.urlopen(request, timeout=60) as response:  # noqa: S310
        files = json.load(response)["files"]
    wanted = Version(version)
    found = []
    for file in files:
        filename = file["filename"]
        if file.get("yanked") or NOT_LINUX.search(filename):
            continue
        stem = (
            filename[: -len(".whl")]
            if filename.endswith(".whl")
            else re.sub(r"\.(tar\.gz|zip|tar\.bz2)$", "", filename)
        )
        parts = stem.split("-")
        # wheel: name-version-...; sdist: name-version (the name may hold dashes in old sdists)
        candidates = [parts[1]] if filename.endswith(".whl") else ["-".join(parts[i:]) for i in range(1, len(parts))]
        if any(_same_version(c, wanted) for c in candidates):
            found.append(file["hashes"]["sha256"])
    if not found:
        local = " (a local version: built here, not published)" if wanted.local else ""
        raise SystemExit(
            f"{name}=={version}{local}: no Linux file of this version on {index}: it cannot go into the lock"
        )
    return sorted(set(found))


def _same_version(candidate: str, wanted: Version) -> bool:
    """Whether a file name's version part is `wanted`; a part that is no version at all is not."""
    try:
        return Version(candidate) == wanted
    except ValueError:  # packaging's InvalidVersion: a name segment such as "3d" in "foo-3d-1.0.tar.gz"
        return False


def write(lock: Path, pyproject: Path) -> None:
    pins = installed_closure(image_requirements(pyproject))
    python = ".".join(map(str, sys.version_info[:3]))
    lines = [
        "# The images' Python dependencies (pyproject.toml with the extras " + ", ".join(IMAGE_EXTRAS) + "), at the",
        f"# versions `make test` passed with (Python {python}), torch excluded (the base image's).",
        "# Generated by `make lock` (deploy/lock.py); do not edit by hand.",
    ]
    for name in sorted(pins):
        hashes = _hashes(name, pins[name])
        lines.append(f"{name}=={pins[name]} \\")
        lines += [f"    --hash=sha256:{h} \\" for h in hashes[:-1]] + [f"    --hash=sha256:{hashes[-1]}"]
    lock.write_text("\n".join(lines) + "\n")
    print(f"{lock}: {len(pins)} packages")


def read_pins(lock: Path) -> dict[str, str]:
    """{canonical name: version} of a lock file."""
    pins = {}
    for line in lock.read_text().splitlines():
        match = PIN.match(line)
        if match:
            pins[canonicalize_name(match[1])] = match[2]
    return pins


def differences(pins: dict[str, str], installed: dict[str, str]) -> list[str]:
    """Each locked package that is missing or at another version in `installed` ({canonical name: version})."""
    found = []
    for name, version in sorted(pins.items()):
        have = installed.get(name)
        if have != version:
            found.append(f"{name}: locked {version}, installed {have or 'nothing'}")
    return found


def installed_versions() -> dict[str, str]:
    return {canonicalize_name(d.metadata["Name"]): d.version for d in metadata.distributions() if d.metadata["Name"]}


def check(lock: Path) -> list[str]:
    """What is wrong with this environment against the lock: versions that differ, and dependencies of a
    locked package, or of rentune itself once installed, that are missing or unsatisfied (torch's included:
    the base image's must fit)."""
    pins = read_pins(lock)
    installed = installed_versions()
    problems = differences(pins, installed)
    checked = [name for name in sorted(pins) if installed.get(name) == pins[name]]
    for name in [*checked, *(["rentune"] if "rentune" in installed else [])]:
        for text in metadata.distribution(name).requires or []:
            needed = Requirement(text)
            if not _applies(needed, set()):
                continue
            have = installed.get(canonicalize_name(needed.name))
            if have is None or not needed.specifier.contains(have, prereleases=True):
                problems.append(f"{name}=={installed[name]} needs {needed}: installed {have or 'nothing'}")
    return problems


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def main(argv: list[str]) -> int:
    if len(argv) != 2 or argv[0] not in ("write", "check", "constraints"):
        raise SystemExit(__doc__)
    command, lock = argv[0], Path(argv[1])
    if command == "write":
        write(lock, Path(__file__).resolve().parents[1] / "pyproject.toml")
        return 0
    if command == "constraints":
        print("\n".join(f"{name}=={version}" for name, version in sorted(read_pins(lock).items())))
        return 0
    problems = check(lock)
    for problem in problems:
        print(f"{lock}: {problem}", file=sys.stderr)
    print(f"{lock}: {len(read_pins(lock))} packages, sha256 {sha256(lock)}: " + ("NOT MET" if problems else "met"))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
