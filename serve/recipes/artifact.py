"""The on-disk cache of runtime artifacts (an ONNX graph, a CTranslate2 model): built once per
key, checked on every load.

A folder per key under the cache root holds the artifact's files and `manifest.json` (format,
key, the parts the key hashes, each file's SHA-256, the decision and the evidence of the build).
A load trusts nothing it has not checked: a missing or unreadable manifest, another format or
key, a missing file or one whose digest differs (a half-copied or corrupted artifact) is
rebuilt, never served. A build happens in a private folder renamed into place, so replicas starting
together never read half an artifact; the second to finish keeps the first one's.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)
FORMAT = 1
MANIFEST = "manifest.json"


@dataclass(frozen=True)
class Artifact:
    path: Path  # the first of its files (the model a runtime opens; its folder holds the rest)
    manifest: dict

    @property
    def decision(self) -> dict:
        return self.manifest["decision"]

    @property
    def size_bytes(self) -> int:
        return sum((self.path.parent / name).stat().st_size for name in self.manifest["files"])


def cache_root() -> Path:
    """~/.cache/canary-gateway (or under XDG_CACHE_HOME): the root of every cache the project
    keeps (artifacts, `auto` choices, accuracy-aware plans)."""
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "canary-gateway"


def artifact_root(setting: str | None) -> Path:
    """Where runtime artifacts are cached: the `onnx_dir` setting, or `cache_root()/onnx`."""
    return Path(setting).expanduser() if setting else cache_root() / "onnx"


def artifact_key(parts: dict) -> str:
    return hashlib.sha256(json.dumps([FORMAT, parts], sort_keys=True).encode()).hexdigest()[:16]


def file_digest(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while chunk := handle.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def check(folder: Path, key: str, files: tuple[str, ...]) -> Artifact:
    """The artifact in `folder`, or ValueError saying why it cannot be trusted."""
    try:
        manifest = json.loads((folder / MANIFEST).read_text())
    except (OSError, ValueError) as exc:
        raise ValueError(f"manifest unreadable ({type(exc).__name__})") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise ValueError("manifest of another format")
    if manifest.get("key") != key:
        raise ValueError("manifest of another key")
    digests = manifest.get("files")
    if not isinstance(digests, dict) or sorted(digests) != sorted(files):
        raise ValueError("manifest lists other files")
    for name in files:
        if not (folder / name).is_file():
            raise ValueError(f"{name} missing")
        if file_digest(folder / name) != digests[name]:
            raise ValueError(f"{name} does not match its digest")
    return Artifact(folder / files[0], manifest)


# writes the artifact's files into a folder; returns (decision, evidence)
Build = Callable[[Path], tuple[dict, dict]]


def load_or_build(parts: dict, root: Path, build: Build, files: tuple[str, ...]) -> Artifact:
    """The cached artifact for `parts`, built by `build` when missing or untrustworthy; `files`
    are what the build leaves in its folder (anything else it wrote is removed)."""
    key = artifact_key(parts)
    folder = root / key
    if folder.exists():
        try:
            return check(folder, key, files)
        except ValueError as exc:
            log.warning("onnx artifact %s: %s; rebuilding it", folder, exc)
    root.mkdir(parents=True, exist_ok=True)
    work = root / f".{key}.build{os.getpid()}"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir()
    started = time.monotonic()
    try:
        decision, evidence = build(work)
        for leftover in work.iterdir():
            if leftover.name not in files:
                shutil.rmtree(leftover) if leftover.is_dir() else leftover.unlink()
        manifest = {
            "format": FORMAT, "key": key, "parts": parts,
            "files": {name: file_digest(work / name) for name in files},
            "decision": decision, "evidence": evidence,
            "built_s": round(time.monotonic() - started, 1), "built_at": time.time(),
        }
        (work / MANIFEST).write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
        shutil.rmtree(folder, ignore_errors=True)  # an untrustworthy one, if any
        try:
            work.rename(folder)
        except OSError:  # another replica renamed its build in first: use that one
            return check(folder, key, files)
        return check(folder, key, files)
    finally:
        shutil.rmtree(work, ignore_errors=True)
