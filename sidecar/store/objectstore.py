"""The object store behind `sidecar.store.upload.ObjectStore`: fsspec, with s3fs for `s3://` URLs.

The only module that imports fsspec, s3fs or botocore (pyproject's banned-api). Credentials are
botocore's own chain: AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY (and AWS_SESSION_TOKEN), a
profile in ~/.aws (AWS_PROFILE), web identity, or the instance's role; nothing of them passes
through the sidecar's config (config.CREDENTIALS_HELP). s3fs is the optional extra `[s3]`:
without it, a config that sets upload.url fails at start and names the install.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from sidecar.config.settings import AWS_CHAIN_HELP, UploadConfig
from sidecar.errors import ConfigError, UploadError

S3_MISSING = ("upload.url is set but s3fs is not installed: pip install 'vllm-sidecar[s3]' "
              "(or unset upload.url)")  # fmt: skip


class FsspecStore:
    """`put` and fresh listings over any fsspec filesystem, under `root` (bucket/prefix).

    The error policy of the boundary: whatever the filesystem raises (OSError from s3fs,
    botocore's EndpointConnectionError or ClientError, aiohttp's) is an UploadError, a failed
    try the uploader counts and backs off from; none ends the upload thread."""

    def __init__(self, fs: Any, root: str, url: str, endpoint_url: str | None = None) -> None:
        self.fs, self.url, self.endpoint_url = fs, url, endpoint_url
        self.root = root.rstrip("/")

    def put(self, local: Path, key: str) -> None:
        try:
            self.fs.put_file(str(local), f"{self.root}/{key}")
        except Exception as exc:
            raise UploadError(f"put {self.url}/{key}: {type(exc).__name__}: {exc}") from exc

    def sizes(self, prefix: str) -> Mapping[str, int]:
        path = f"{self.root}/{prefix}"
        try:
            self.fs.invalidate_cache(path)  # a listing cached before an outage proves nothing
            found = self.fs.find(path, detail=True)
        except Exception as exc:
            raise UploadError(f"list {self.url}/{prefix}: {type(exc).__name__}: {exc}") from exc
        base = self.fs._strip_protocol(self.root).rstrip("/") + "/"
        return {p[len(base):] if p.startswith(base) else p: int(info["size"])
                for p, info in found.items()}  # fmt: skip


def s3_filesystem(config: UploadConfig) -> Any:
    """An s3fs filesystem with the config's endpoint, timeouts and retries. botocore's own
    retries are off: s3fs retries a request `retries` more times, and the uploader's backoff
    is the outer loop, so a store that is down costs one bounded try per backoff step."""
    try:
        import s3fs
    except ImportError:
        raise ConfigError(S3_MISSING) from None
    client = {"endpoint_url": config.endpoint_url} if config.endpoint_url else {}
    timeouts = {"connect_timeout": config.timeout_s, "read_timeout": config.timeout_s}
    fs = s3fs.S3FileSystem(
        anon=False,
        client_kwargs=client,
        config_kwargs={**timeouts, "retries": {"max_attempts": 1}},
        skip_instance_cache=True,  # a reload with another endpoint must not get the old one
    )
    fs.retries = config.retries + 1  # s3fs counts tries, not retries
    return fs


def open_object_store(config: UploadConfig, fs: Any | None = None) -> FsspecStore:
    """The store of `upload.url`; `fs` overrides the filesystem (tests: fsspec's memory)."""
    if config.url is None:
        raise ConfigError("upload.url is not set")
    parts = urlsplit(config.url)
    root = f"{parts.netloc}{parts.path}".rstrip("/")
    return FsspecStore(fs if fs is not None else s3_filesystem(config), root, config.url,
                       config.endpoint_url)  # fmt: skip


@dataclass(frozen=True, slots=True)
class Probe:
    ok: bool
    detail: str
    fix: str = ""


def credentials_source() -> str | None:
    """Where botocore finds credentials (`env`, `shared-credentials-file`, `iam-role`, ...);
    None when it finds none."""
    try:
        import botocore.session
    except ImportError:
        raise ConfigError(S3_MISSING) from None
    credentials = botocore.session.get_session().get_credentials()
    return None if credentials is None else str(credentials.method)


def probe(config: UploadConfig, fs: Any | None = None) -> Probe:
    """For `doctor`: credentials found, and the bucket listed (read access, reachable)."""
    if fs is None:
        try:
            source = credentials_source()
        except ConfigError as exc:
            return Probe(False, str(exc), "pip install 'vllm-sidecar[s3]'")
        if source is None:
            return Probe(False, "no AWS credentials found", AWS_CHAIN_HELP)
    else:
        source = "given"
    store = open_object_store(config, fs)
    where = config.endpoint_url or "AWS"
    try:
        store.fs.ls(store.root.split("/", 1)[0], detail=False)
    except Exception as exc:  # botocore and s3fs raise many kinds; each is a failed check
        return Probe(False, f"{config.url} at {where}: {type(exc).__name__}: {exc}",
                     "check the bucket name, upload.endpoint_url, the network and the "
                     "credentials' permissions (s3:ListBucket, s3:PutObject)")  # fmt: skip
    return Probe(True, f"{config.url} at {where}: bucket reachable; credentials from {source}")
