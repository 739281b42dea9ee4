"""Checkpoint integrity: ``laquant.json`` records the sha256 of every file a checkpoint's numbers
depend on (the weight files and their index, ``recipe.yaml``, ``stats.safetensors``,
``tokenizer.json``, the remote-code module) and of its ``quantization_config``; loading checks them.

A mismatch is an error naming the file. Checking reads every file once (about 1-2 GB/s): for very
large models ``verify=False`` (``--no-verify``, or ``LAQUANT_NO_VERIFY=1`` in the environment, which
also covers transformers' ``from_pretrained``) skips it. Checkpoints written before digests existed
have no ``laquant.json`` and load unchecked.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from laquant.errors import LaquantError

MANIFEST_NAME = "laquant.json"
SKIP_ENV = "LAQUANT_NO_VERIFY"
DIGESTED = ("recipe.yaml", "stats.safetensors", "tokenizer.json")  # besides the weights and remote code
_CHUNK = 1 << 22


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(_CHUNK):
            digest.update(block)
    return digest.hexdigest()


def quantization_config_digest(qcfg: dict) -> str:
    """The digest of a quantization_config as parsed from config.json (key order and spacing aside)."""
    return hashlib.sha256(json.dumps(qcfg, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def write_manifest(folder: Path, files: list[str], extra: dict | None = None) -> None:
    """``folder/laquant.json`` with the digest and size of each of ``files`` (names in ``folder``)
    and of config.json's quantization_config."""
    from laquant import __version__
    from laquant.loading import read_config

    folder = Path(folder)
    entries = {name: {"sha256": sha256_file(folder / name), "bytes": (folder / name).stat().st_size}
               for name in sorted(files)}
    qcfg = read_config(folder).get("quantization_config")
    manifest = {"laquant_version": __version__, "algorithm": "sha256", "files": entries,
                "quantization_config": quantization_config_digest(qcfg) if qcfg is not None else None, **(extra or {})}
    (folder / MANIFEST_NAME).write_text(json.dumps(manifest, indent=2) + "\n")


def verify_enabled(verify: bool | None) -> bool:
    if verify is not None:
        return verify
    return os.environ.get(SKIP_ENV, "").strip().lower() in ("", "0", "false", "no")


def verify_checkpoint(folder: Path, verify: bool | None = None) -> bool:
    """Check ``folder`` against its ``laquant.json``; True if checked, False if skipped or there is
    no manifest (an older checkpoint). Raises :class:`LaquantError` naming the first bad file."""
    from laquant.loading import read_config

    folder = Path(folder)
    manifest_path = folder / MANIFEST_NAME
    if not verify_enabled(verify) or not manifest_path.is_file():
        return False
    try:
        manifest = json.loads(manifest_path.read_text())
        entries = manifest["files"]
        items = [(name, e["sha256"], int(e["bytes"])) for name, e in entries.items()]
    except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError, ValueError, AttributeError):
        raise LaquantError(f"{manifest_path} is not a valid laquant digest file; the checkpoint is corrupted "
                           "(re-create or re-download it)") from None
    for name, digest, size in items:
        path = folder / name
        if Path(name).is_absolute() or ".." in Path(name).parts:
            raise LaquantError(f"{manifest_path} names a file outside the checkpoint: {name}")
        if not path.is_file():
            raise LaquantError(f"{path} is missing (listed in {MANIFEST_NAME}); copy the whole checkpoint folder")
        actual = path.stat().st_size
        if actual != size:
            raise LaquantError(f"{path} is truncated or changed: {actual} bytes, {size} written (sha256 check "
                               f"in {MANIFEST_NAME}); re-create or re-download the checkpoint")
        if sha256_file(path) != digest:
            raise LaquantError(f"{path} is corrupted: its sha256 differs from the one recorded in {MANIFEST_NAME}; "
                               "re-create or re-download the checkpoint")
    expected = manifest.get("quantization_config")
    if expected is not None:
        qcfg = read_config(folder).get("quantization_config")
        if qcfg is None or quantization_config_digest(qcfg) != expected:
            raise LaquantError(f"{folder / 'config.json'}: its quantization_config differs from the one recorded in "
                               f"{MANIFEST_NAME} (edited or corrupted); re-create or re-download the checkpoint")
    return True
