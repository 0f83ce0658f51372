"""The on-disk cache of ONNX artifacts: built once per key, checked on every load.

A folder per key under the cache root holds `model.onnx` and `manifest.json` (format, key, the
parts the key hashes, the file's SHA-256, the decision and the evidence of the build). A load
trusts nothing it has not checked: a missing or unreadable manifest, another format or key, a
missing file or one whose digest differs (a half-copied or corrupted artifact) is rebuilt,
never served. A build happens in a private folder renamed into place, so replicas starting
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
MODEL = "model.onnx"
MANIFEST = "manifest.json"


@dataclass(frozen=True)
class Artifact:
    path: Path  # the .onnx file
    manifest: dict

    @property
    def decision(self) -> dict:
        return self.manifest["decision"]

    @property
    def size_bytes(self) -> int:
        return self.path.stat().st_size


def artifact_key(parts: dict) -> str:
    return hashlib.sha256(json.dumps([FORMAT, parts], sort_keys=True).encode()).hexdigest()[:16]


def file_digest(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while chunk := handle.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def check(folder: Path, key: str) -> Artifact:
    """The artifact in `folder`, or ValueError saying why it cannot be trusted."""
    try:
        manifest = json.loads((folder / MANIFEST).read_text())
    except (OSError, ValueError) as exc:
        raise ValueError(f"manifest unreadable ({type(exc).__name__})") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise ValueError("manifest of another format")
    if manifest.get("key") != key:
        raise ValueError("manifest of another key")
    model = folder / MODEL
    if not model.is_file():
        raise ValueError("model file missing")
    if file_digest(model) != manifest.get("sha256"):
        raise ValueError("model file does not match its digest")
    return Artifact(model, manifest)


Build = Callable[[Path], tuple[dict, dict]]  # writes MODEL into a folder -> (decision, evidence)


def load_or_build(parts: dict, root: Path, build: Build) -> Artifact:
    """The cached artifact for `parts`, built by `build` when missing or untrustworthy."""
    key = artifact_key(parts)
    folder = root / key
    if folder.exists():
        try:
            return check(folder, key)
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
            if leftover.name != MODEL:
                leftover.unlink()
        manifest = {
            "format": FORMAT, "key": key, "parts": parts, "sha256": file_digest(work / MODEL),
            "decision": decision, "evidence": evidence,
            "built_s": round(time.monotonic() - started, 1), "built_at": time.time(),
        }
        (work / MANIFEST).write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
        shutil.rmtree(folder, ignore_errors=True)  # an untrustworthy one, if any
        try:
            work.rename(folder)
        except OSError:  # another replica renamed its build in first: use that one
            return check(folder, key)
        return check(folder, key)
    finally:
        shutil.rmtree(work, ignore_errors=True)
