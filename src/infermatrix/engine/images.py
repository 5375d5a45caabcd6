"""Images of the engine: inspect, tag, remove, relabel, and files read out of one without
running it."""

from __future__ import annotations

import contextlib
import json
import shlex
import tarfile
import tempfile
from pathlib import Path
from typing import Any, Iterable, Iterator

from ..errors import StageFailure
from .host import Host, _sdk_log, _translated, reconnecting

# Label put on every container this tool creates, so tests and cleanup find only their own.
OWNER_LABEL = "io.infermatrix.owner"


def split_ref(ref: str) -> tuple[str, str]:
    """`repo/name:tag` -> (`repo/name`, `tag`); a registry port is not a tag."""
    name, sep, tag = ref.rpartition(":")
    if not sep or "/" in tag:
        return ref, "latest"
    return name, tag


def layers_of(info: dict[str, Any] | None) -> list[str]:
    """The diff ids of an image's layers, bottom first, from its `docker image inspect`."""
    return ((info or {}).get("RootFS") or {}).get("Layers") or []


class Images(Host):
    @reconnecting
    def inspect_image(self, ref: str) -> dict[str, Any] | None:
        """`docker image inspect` as a dict, or None when there is no such image."""
        with _translated(f"docker image inspect {ref}", missing_ok=True):
            return self.sdk().api.inspect_image(ref)
        return None

    def image_id_of(self, ref: str) -> str | None:
        info = self.inspect_image(ref)
        return info["Id"] if info else None

    def image_layers(self, ref: str) -> list[str]:
        """The image's layer diff ids, bottom first (empty when there is no such image)."""
        return layers_of(self.inspect_image(ref))

    def image_exists(self, ref: str) -> bool:
        return self.inspect_image(ref) is not None

    def image_labels(self, ref: str) -> dict[str, str]:
        info = self.inspect_image(ref)
        if info is None:
            raise StageFailure(f"no image {ref}")
        return dict((info.get("Config") or {}).get("Labels") or {})

    def tag_image(self, image: str, ref: str) -> None:
        repository, tag = split_ref(ref)
        _sdk_log(f"docker tag {shlex.quote(image)} {shlex.quote(ref)}")
        with _translated(f"docker tag {image} {ref}"):
            done = self.sdk().api.tag(image, repository, tag, force=True)
        if not done:
            raise StageFailure(f"could not tag {image} as {ref}")

    def remove_image(self, ref: str, force: bool = False) -> bool:
        """Remove an image reference; False when there was none."""
        _sdk_log(f"docker rmi {'--force ' if force else ''}{shlex.quote(ref)}")
        with _translated(f"docker rmi {ref}", missing_ok=True):
            self.sdk().api.remove_image(ref, force=force, noprune=False)
            return True
        return False

    def commit_with_labels(self, image: str, ref: str, labels: dict[str, str]) -> str:
        """A new image = `image` plus `labels`, nothing else changed (its parent is `image`,
        its layers, command and environment are the same), tagged `ref`; returns its id.

        `docker create` (never started, no label or command of our own: commit copies the
        container's config) then `docker commit --change LABEL ...`, then the container is
        removed.
        """
        import docker

        changes = [f"LABEL {json.dumps(k)}={json.dumps(v)}" for k, v in sorted(labels.items())]
        _sdk_log(f"docker create {shlex.quote(image)} && docker commit "
                 + " ".join(f"--change {shlex.quote(c)}" for c in changes) + f" <container> {ref}")
        api = self.sdk().api
        with _translated(f"docker create {image}"):
            try:
                created = api.create_container(image)
            except docker.errors.APIError:  # an image with neither CMD nor ENTRYPOINT
                created = api.create_container(image, command=["/bin/true"])
                changes.append("CMD []")
        try:
            repository, tag = split_ref(ref)
            with _translated(f"docker commit {ref}"):
                result = api.commit(created["Id"], repository=repository, tag=tag,
                                    changes=changes)
        finally:
            api.remove_container(created["Id"], force=True, v=True)
        return result["Id"]

    def image_env(self, image: str) -> dict[str, str]:
        """The image's configured environment (Config.Env)."""
        found = self.inspect_image(image) or {}
        pairs = (item.partition("=") for item in (found.get("Config") or {}).get("Env") or [])
        return {key: value for key, _, value in pairs}

    def emulation_of(self, image: str) -> str | None:
        """Why programs of `image` run emulated on this engine ("linux/arm64 under QEMU on
        linux/amd64"), or None when the image is for the engine's own CPU (a remote engine's
        CPU is its host's, not this machine's)."""
        info = self.inspect_image(image) or {}
        if not info.get("Architecture"):
            return None
        image_platform = f"{info.get('Os') or 'linux'}/{info['Architecture']}"
        own = self.platform()
        return None if image_platform == own else f"{image_platform} under QEMU on {own}"

    def copy_from_image(self, image: str, paths: Iterable[str],
                        dest_dir: Path) -> dict[str, Path]:
        """Copy paths out of an image without running it (create a container, read archives).

        Returns {path in image: where it landed under dest_dir}; missing paths are left out.
        """
        import docker

        dest_dir = Path(dest_dir)
        dest_dir.mkdir(parents=True, exist_ok=True)
        copied: dict[str, Path] = {}
        with self._created(image, "  # then docker cp for each path") as (api, container_id):
            for path in paths:
                _sdk_log(f"docker cp {container_id[:12]}:{shlex.quote(path)} {dest_dir}")
                try:
                    stream, _stat = api.get_archive(container_id, path)
                except docker.errors.NotFound:
                    continue
                with _translated(f"docker cp {path}"):
                    copied[path] = _extract_archive(stream, dest_dir, path)
        return copied

    @contextlib.contextmanager
    def exported_filesystem(self, image: str) -> Iterator[Iterator[bytes]]:
        """The filesystem of an image as a tar stream (`docker create` + `docker export`),
        read without running the image; the container is removed afterwards."""
        with self._created(image, " && docker export <container>") as (api, container_id):
            yield api.export(container_id)

    @contextlib.contextmanager
    def _created(self, image: str, then: str) -> Iterator[tuple[Any, str]]:
        """(the API client, the id of) a container of `image`, created and never started (its
        files are read), removed afterwards; `then`: what the log line says comes next."""
        api = self.sdk().api
        _sdk_log(f"docker create {shlex.quote(image)}{then}")
        with _translated(f"docker create {image}"):
            container = api.create_container(image, command=["/bin/true"],
                                             labels={OWNER_LABEL: "infermatrix"})
        try:
            yield api, container["Id"]
        finally:
            api.remove_container(container["Id"], force=True, v=True)


def _extract_archive(stream: Iterable[bytes], dest_dir: Path, path: str) -> Path:
    """Extract a get_archive stream (a tar whose top entry is the path's basename)."""
    with tempfile.TemporaryFile() as spool:
        for chunk in stream:
            spool.write(chunk)
        spool.seek(0)
        with tarfile.open(fileobj=spool) as archive:
            archive.extractall(dest_dir, filter="tar")
    return dest_dir / Path(path.rstrip("/")).name
