"""Model locations: how the registry names a model folder so that any host can find it.

The registry's ``Model.path`` holds a location: a path relative to the model repository
(``logreg/1``), a full fsspec URL (``s3://bucket/models/logreg/1``), or an absolute local path
(what records written without a repository hold). Each host resolves a relative location
against its own ``CLIPSTREAM_MODEL_REPOSITORY``, so the applier and a worker on another machine
may reach the repository at different places. A worker copies a remote version folder into its
local cache once, since ONNX Runtime and torch load local files; a version folder is immutable
(a new version is a new folder), so the copy never goes stale (docs/design/0019).
"""

from __future__ import annotations

import hashlib
import os
import posixpath
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from clipstream.errors import ConfigError
from clipstream.settings import Settings
from registry.spec import ModelSpec, load_spec, parse_spec

SPEC_FILE = "model.yaml"
_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")


def is_url(text: str) -> bool:
    """``s3://...``, ``file://...`` or a chained fsspec URL (``simplecache::s3://...``)."""
    return bool(_SCHEME.match(text)) or "::" in text


def _url_to_fs(url: str) -> tuple[Any, str]:
    import fsspec.core  # only URLs need fsspec: plain folders cost what they always did

    try:
        return fsspec.core.url_to_fs(url)
    except (ImportError, ValueError) as exc:
        raise ConfigError(
            f"cannot open {url}: {exc} (an object store needs its fsspec backend installed, "
            "e.g. `pip install s3fs` for s3://)"
        ) from exc


def _local(text: str) -> Path | None:
    """The local folder a path or ``file://`` URL names; None for anything remote."""
    if not is_url(text):
        return Path(text).expanduser().resolve()
    if text.startswith("file://"):
        return Path(_url_to_fs(text)[1])
    return None


def sibling(location: str, version: str) -> str:
    """``<repository>/<name>/<version>`` beside a location: another version of the same model."""
    return posixpath.join(posixpath.dirname(location.rstrip("/")), version)


@dataclass(frozen=True)
class Repository:
    """The model repository root as this host sees it (``root`` None: there is none)."""

    root: str | None = None
    # where remote version folders are copied (CLIPSTREAM_CACHE_DIR/models)
    cache_dir: Path | None = None

    @classmethod
    def from_settings(cls, settings: Settings) -> "Repository":
        return cls((settings.model_repository or "").strip() or None, Path(settings.cache_dir) / "models")

    def location_of(self, source: str | Path) -> str:
        """What the registry records for a model folder (local, or a URL) an applier names:
        relative when it lies inside the repository, else its absolute path or full URL."""
        text = str(source)
        local = _local(text)
        if local is not None:
            root = _local(self.root) if self.root else None
            if root is not None and local != root and local.is_relative_to(root):
                return local.relative_to(root).as_posix()
            return str(local)
        if self.root and is_url(self.root):
            prefix = self.root.rstrip("/") + "/"
            if text.startswith(prefix) and text.rstrip("/") != prefix.rstrip("/"):
                return text[len(prefix):].strip("/")
        return text.rstrip("/")

    def url(self, location: str) -> str:
        """The local path or URL a location names on this host."""
        if is_url(location) or os.path.isabs(location):
            return location
        if not self.root:
            raise ConfigError(
                f"model location {location!r} is relative to a model repository, and "
                "CLIPSTREAM_MODEL_REPOSITORY is not set on this host: set it to the folder or "
                f"URL (e.g. s3://bucket/models) that holds {location}"
            )
        if is_url(self.root):
            return self.root.rstrip("/") + "/" + location
        return str(Path(self.root).expanduser().resolve() / location)

    def folder(self, location: str) -> Path:
        """Where the model's files are, or will be once fetched, on this host (never raises:
        the registry view shows it even when the location cannot be resolved here)."""
        try:
            url = self.url(location)
            local = _local(url)
        except ConfigError:
            return Path(location)
        return local if local is not None else self._cache_folder(url)

    def _resolve(self, location: str) -> tuple[str, Path | None]:
        """(url, local folder or None when remote); a local folder must hold a ``model.yaml``."""
        url = self.url(location)
        local = _local(url)
        if local is not None and not (local / SPEC_FILE).is_file():
            if local.is_dir():  # the folder is here: it lacks its model.yaml, not a path
                others = [n for n in ("model-settings.json", "config.pbtxt") if (local / n).is_file()]
                raise ConfigError(f"{local} holds no {SPEC_FILE}: write one (docs/MODELS.md)" + (
                    f"; {others[0]} is another server's, which clipstream does not read" if others else ""))
            raise ConfigError(f"{local / SPEC_FILE} does not exist{self._hint(location)}")
        return url, local

    def read_spec(self, location: str) -> ModelSpec:
        """The model's spec, read where it lies: a remote ``model.yaml`` alone, not the folder."""
        url, local = self._resolve(location)
        if local is not None:
            return load_spec(local)
        fs, path = _url_to_fs(url)
        where = url.rstrip("/") + "/" + SPEC_FILE
        try:
            raw = yaml.safe_load(fs.cat_file(path.rstrip("/") + "/" + SPEC_FILE))
        except FileNotFoundError:
            raise ConfigError(f"{where} does not exist{self._hint(location)}") from None
        except yaml.YAMLError as exc:
            raise ConfigError(f"{where} is not valid YAML: {exc}") from exc
        except Exception as exc:  # each object store has its own errors: name the URL
            raise ConfigError(f"could not read {where}: {exc}{self._hint(location)}") from exc
        if not isinstance(raw, dict):
            raise ConfigError(f"{where}: expected a mapping at the top")
        return parse_spec(raw, self._cache_folder(url), where)

    def fetch(self, location: str) -> Path:
        """A local folder holding the model: the folder itself, or a copy of a remote one."""
        url, local = self._resolve(location)
        if local is not None:
            return local
        dest = self._cache_folder(url)
        if (dest / SPEC_FILE).is_file():
            return dest
        fs, base = _url_to_fs(url)
        base = base.rstrip("/")
        dest.parent.mkdir(parents=True, exist_ok=True)
        part = dest.parent / f".{dest.name}.{os.getpid()}.part"
        shutil.rmtree(part, ignore_errors=True)
        try:
            files = [f for f in fs.find(base) if f.startswith(base + "/")]
            if not files:  # some stores answer an unreachable or missing folder with nothing
                raise ConfigError(f"found no files under {url}{self._hint(location)}")
            for remote in files:
                target = part / remote[len(base) + 1:]
                target.parent.mkdir(parents=True, exist_ok=True)
                fs.get_file(remote, str(target))
            if not (part / SPEC_FILE).is_file():
                raise ConfigError(f"no {SPEC_FILE} under {url}{self._hint(location)}")
            try:
                os.rename(part, dest)  # whole or not at all: a crash leaves only the .part
            except OSError:
                if not (dest / SPEC_FILE).is_file():  # else another worker copied it first
                    raise
        except ConfigError:
            raise
        except Exception as exc:  # each object store has its own errors: name the URL
            raise ConfigError(f"could not copy {url} into {dest}: {exc}{self._hint(location)}") from exc
        finally:
            shutil.rmtree(part, ignore_errors=True)
        return dest

    def _cache_folder(self, url: str) -> Path:
        cache = self.cache_dir or Settings().cache_dir / "models"
        tail = re.sub(r"[^A-Za-z0-9_.-]+", "_", "-".join(url.rstrip("/").split("/")[-2:]))
        return cache / f"{tail}-{hashlib.sha1(url.encode()).hexdigest()[:12]}"

    def _hint(self, location: str) -> str:
        if is_url(location):
            return ""
        if os.path.isabs(location):
            return (
                " (the registry names an absolute path of the host that applied the model: "
                "set CLIPSTREAM_MODEL_REPOSITORY where you apply, so the registry records a "
                "location inside the repository, and on every host that serves it)"
            )
        return (
            f" (location {location!r} resolved against CLIPSTREAM_MODEL_REPOSITORY={self.root}: "
            "point it at the repository that holds the model on this host)"
        )
