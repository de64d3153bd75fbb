"""A Docker engine of the tests' own, and the CPU base image the shipped Dockerfiles are built on.

    engine = DockerEngine.start(cache)   # dockerd on its own socket, data root and exec root; no bridge, no
    ...                                  # iptables (nothing on the host's network changes)
    engine.stop()                        # containers killed, dockerd stopped, its mounts gone

`cpu_base_image(engine, ...)` makes `rentune-test/cpu-base:<debian release>-torch<version>-make`: Debian
minbase from `debootstrap` (with the host's extra CA certificates, for an HTTPS proxy), imported with
`docker import`, then `make cpu-base` (deploy/cpu-base.Dockerfile, the docs' recipe) on it with the host's
CPU torch wheel. The data root lives in the cache folder, so the base
image and the images' layer cache survive from one test run to the next.

`engine_unavailable()` says why no engine can be had here (not root, no apt-get), or None: on a root
machine with apt, a failure to install or start the engine is an error, never a skip.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tests.s3server import dies_with_us

ROOT = Path(__file__).resolve().parents[1]

__all__ = ["DockerEngine", "cpu_base_image", "engine_unavailable", "install_engine", "mounts_under"]

START_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 60.0
DEBIAN_MIRROR = "http://deb.debian.org/debian"
# What the shipped Dockerfiles expect of a base besides torch: Python >= 3.10 with venv, bash, apt,
# useradd (passwd), and CA certificates for pip.
DEBIAN_PACKAGES = "python3,python3-venv,ca-certificates,passwd"
HOST_EXTRA_CAS = Path("/usr/local/share/ca-certificates")


def _installed() -> bool:
    return all(shutil.which(tool) for tool in ("dockerd", "debootstrap", "docker"))


def engine_unavailable() -> str | None:
    """Why this machine cannot have a Docker engine of its own, or None."""
    if os.geteuid() != 0:
        return "not root: dockerd and debootstrap need root"
    if _installed():
        return None
    if shutil.which("apt-get") is None:
        return "dockerd, debootstrap or docker not found, and no apt-get to install them"
    return None


def install_engine() -> None:
    """Debian's docker.io and debootstrap, where missing (root and apt-get are checked before)."""
    if _installed():
        return
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    install = ["apt-get", "install", "-y", "--no-install-recommends", "docker.io", "debootstrap"]
    if subprocess.run(install, env=env, capture_output=True, check=False).returncode != 0:
        subprocess.run(["apt-get", "update"], env=env, capture_output=True, check=True)
        done = subprocess.run(install, env=env, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"apt-get install docker.io debootstrap failed:\n{done.stdout}{done.stderr}")


def mounts_under(*folders: Path) -> list[str]:
    """Mount points below any of `folders`, deepest first (the order to unmount them in)."""
    found = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        point = line.split()[4].replace("\\040", " ")
        if any(point == str(f) or point.startswith(f"{f}/") for f in folders):
            found.append(point)
    return sorted(found, key=len, reverse=True)


class DockerEngine:
    """dockerd with its own socket, data root (under `cache`, kept) and exec root (a fresh temp folder);
    `docker(...)` talks to it and to nothing else. One engine per cache folder at a time (a file lock)."""

    def __init__(self, cache: Path):
        self.cache = cache
        self.data_root = cache / "data-root"
        # Short: containerd puts unix sockets under the exec root, and their paths are limited to 108 bytes.
        self.exec_root = Path(tempfile.mkdtemp(prefix="rtd-", dir="/tmp"))
        self.socket = self.exec_root / "docker.sock"
        self.log_path = self.exec_root / "dockerd.log"
        self.env = {**os.environ, "DOCKER_HOST": f"unix://{self.socket}", "DOCKER_BUILDKIT": "0"}
        self.process: subprocess.Popen | None = None
        self._lock = None

    @classmethod
    def start(cls, cache: Path) -> DockerEngine:
        engine = cls(cache)
        try:
            engine._start()
        except BaseException:
            engine.stop()
            raise
        return engine

    def _start(self) -> None:
        self.data_root.mkdir(parents=True, exist_ok=True)
        self._lock = open(self.cache / "engine.lock", "w")  # noqa: SIM115 - held until stop()
        fcntl.flock(self._lock, fcntl.LOCK_EX)  # another test run on this cache waits for it
        command = [
            "dockerd", "--data-root", str(self.data_root), "--exec-root", str(self.exec_root),
            "--host", f"unix://{self.socket}", "--pidfile", str(self.exec_root / "dockerd.pid"),
            "--iptables=false", "--ip6tables=false", "--bridge=none", "--storage-driver", "overlay2",
        ]  # fmt: skip
        with open(self.log_path, "wb") as log:
            # TERM, not KILL, if this test process dies: dockerd then stops its containers and unmounts.
            self.process = subprocess.Popen(
                dies_with_us(command, "TERM"), stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
        deadline = time.monotonic() + START_TIMEOUT_S
        while self.docker("version", check=False).returncode != 0:
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"dockerd did not start; its log:\n{self.log_tail()}")
            time.sleep(0.2)

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def _run(self, *argv: str, check: bool, timeout: float, **kwargs) -> subprocess.CompletedProcess:
        """`argv` against this engine (DOCKER_HOST, no BuildKit), output captured as text."""
        done = subprocess.run(
            argv, env=self.env, capture_output=True, text=True, timeout=timeout, check=False, **kwargs
        )
        if check and done.returncode != 0:
            raise RuntimeError(f"{' '.join(argv)} exited {done.returncode}:\n{done.stdout}{done.stderr}")
        return done

    def docker(self, *args: str, check: bool = True, timeout: float = 600, **kwargs) -> subprocess.CompletedProcess:
        """`docker ARGS` against this engine."""
        return self._run("docker", *args, check=check, timeout=timeout, **kwargs)

    def make(self, *args: str, timeout: float = 1800) -> subprocess.CompletedProcess:
        """`make ARGS` in the repository against this engine (the docs' recipe as written: `make image-cpu`)."""
        return self._run("make", *args, check=True, timeout=timeout, cwd=ROOT)

    def has_image(self, reference: str) -> bool:
        return self.docker("image", "inspect", reference, check=False).returncode == 0

    def stop(self) -> None:
        """Kill every container, stop dockerd, unmount what it left mounted and remove the exec root."""
        if self.process is not None and self.process.poll() is None:
            ids = self.docker("ps", "--all", "--quiet", check=False, timeout=30).stdout.split()
            if ids:
                self.docker("rm", "--force", *ids, check=False, timeout=120)
            self.process.terminate()
            try:
                self.process.wait(timeout=STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        for point in mounts_under(self.data_root, self.exec_root):
            subprocess.run(["umount", "--lazy", point], capture_output=True, check=False)
        shutil.rmtree(self.exec_root, ignore_errors=True)
        if self._lock is not None:
            self._lock.close()  # releases the flock
            self._lock = None


def _debian_release() -> str:
    """The host's Debian codename: the base gets the same Python as the host, so the host's torch wheel fits."""
    for line in Path("/etc/os-release").read_text().splitlines():
        if line.startswith("VERSION_CODENAME="):
            return line.split("=", 1)[1].strip('"')
    raise RuntimeError("/etc/os-release has no VERSION_CODENAME: not a Debian host")


def _torch_version() -> str:
    import torch

    return torch.__version__.split("+")[0]


def cpu_base_image(engine: DockerEngine, log=print) -> str:
    """The CPU base image's reference, made (and kept in the engine's data root) if missing."""
    release, torch_version = _debian_release(), _torch_version()
    reference = f"rentune-test/cpu-base:{release}-torch{torch_version}-make"  # built by `make cpu-base`
    if engine.has_image(reference):
        return reference
    debian = f"rentune-test/debian:{release}-minbase"
    if not engine.has_image(debian):
        log(f"docker: debootstrap {release} minbase ...")
        _import_debian(engine, release, debian)
    with tempfile.TemporaryDirectory(prefix="rentune-base-") as context:
        wheel = _download_torch_wheel(engine, debian, torch_version, Path(context))
        log(f"docker: make cpu-base {reference} with {wheel.name} ...")
        engine.make("cpu-base", f"PYTHON_IMAGE={debian}", f"TORCH_WHEEL={wheel}", f"CPU_BASE={reference}")
    return reference


def _import_debian(engine: DockerEngine, release: str, reference: str) -> None:
    """debootstrap --variant=minbase into a temp folder, add the host's extra CAs, `docker import` it."""
    with tempfile.TemporaryDirectory(prefix="rentune-rootfs-") as folder:
        rootfs = Path(folder) / "rootfs"
        command = ["debootstrap", "--variant=minbase", f"--include={DEBIAN_PACKAGES}", release, str(rootfs)]
        done = subprocess.run([*command, DEBIAN_MIRROR], capture_output=True, text=True, timeout=900, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(command)} failed:\n{done.stdout[-3000:]}{done.stderr[-3000:]}")
        # An HTTPS proxy's CA, trusted by the host, must be trusted by pip and apt in the image too.
        extra = sorted(HOST_EXTRA_CAS.glob("*.crt")) if HOST_EXTRA_CAS.is_dir() else []
        for cert in extra:
            shutil.copy2(cert, rootfs / "usr/local/share/ca-certificates" / cert.name)
        if extra:
            subprocess.run(["chroot", str(rootfs), "update-ca-certificates"], capture_output=True, check=True)
        for cache in ("var/cache/apt/archives", "var/lib/apt/lists"):
            for item in (rootfs / cache).glob("*"):
                if item.is_file():
                    item.unlink()
        tar = subprocess.Popen(["tar", "-C", str(rootfs), "-c", "."], stdout=subprocess.PIPE)
        engine.docker("import", "-", reference, stdin=tar.stdout, timeout=600)
        tar.stdout.close()
        if tar.wait() != 0:
            raise RuntimeError(f"tar of {rootfs} failed")


def _download_torch_wheel(engine: DockerEngine, debian: str, version: str, folder: Path) -> Path:
    """The host's CPU torch wheel for the base's Python (pip in a build would take the CUDA build)."""
    python = engine.docker("run", "--rm", debian, "python3", "-c", "import sys; print('%d%d' % sys.version_info[:2])")
    command = [
        sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:",
        "--python-version", python.stdout.strip(), "--dest", str(folder), f"torch=={version}",
    ]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, timeout=900, check=False)
    wheels = sorted(folder.glob("torch-*.whl"))
    if done.returncode != 0 or not wheels:
        raise RuntimeError(f"pip download torch=={version} failed:\n{done.stdout}{done.stderr}")
    if "+cpu" not in wheels[0].name:
        raise RuntimeError(f"pip download torch=={version} gave {wheels[0].name}, not a CPU build")
    return wheels[0]
